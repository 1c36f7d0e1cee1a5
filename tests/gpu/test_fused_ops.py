"""The Triton kernels of ``voxstage.nn.fused`` equal their PyTorch fallbacks on the GPU (needs CUDA)."""

from __future__ import annotations

import pytest
import torch

from voxstage.nn import fused

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available() or not fused.triton_available(), reason="needs CUDA + Triton"
    ),
]


def both(fn, *args):  # type: ignore[no-untyped-def]
    fused.set_triton(True)
    a = fn(*args)
    fused.set_triton(False)
    try:
        b = fn(*args)
    finally:
        fused.set_triton(True)
    return a, b


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_add_rmsnorm(dtype: torch.dtype) -> None:
    x = torch.randn(5, 4096, device="cuda", dtype=dtype)
    d = torch.randn(5, 4096, device="cuda", dtype=dtype)
    alpha = (1 + 0.1 * torch.randn(1, 1, 4096, device="cuda")).to(dtype)
    (s1, y1), (s0, y0) = both(fused.add_rmsnorm, x, d, alpha, 1e-8)
    torch.testing.assert_close(s1, s0, rtol=0, atol=0)
    tol = 1e-2 if dtype == torch.bfloat16 else 1e-5
    torch.testing.assert_close(y1, y0, rtol=tol, atol=tol)
    (_, z1), (_, z0) = both(fused.add_rmsnorm, x[:, :1000], None, alpha[..., :1000], 1e-8)
    torch.testing.assert_close(z1, z0, rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_silu_mul(dtype: torch.dtype) -> None:
    y = torch.randn(3, 2 * 2816, device="cuda", dtype=dtype)
    a, b = both(fused.silu_mul, y)
    tol = 1e-2 if dtype == torch.bfloat16 else 1e-6
    torch.testing.assert_close(a, b, rtol=tol, atol=tol)


@pytest.mark.parametrize("rope", [True, False])
def test_qkv_into_cache(rope: bool) -> None:
    b, heads, hd, window = 4, 8, 128, 50
    qkv = torch.randn(b, 3 * heads * hd, device="cuda", dtype=torch.bfloat16)
    positions = torch.tensor([0, 7, 49, 120], device="cuda")
    index = positions % window
    ds = torch.arange(hd // 2, device="cuda", dtype=torch.float32)
    angles = positions.float().unsqueeze(-1) * torch.exp(ds * (-9.21 * 2 / hd))
    tables = (torch.cos(angles), torch.sin(angles)) if rope else None
    caches = []
    outs = []
    for enabled in (True, False):
        fused.set_triton(enabled)
        k = torch.zeros(6, heads, window, hd, device="cuda", dtype=torch.bfloat16)
        v = torch.zeros_like(k)
        outs.append(fused.qkv_into_cache(qkv, heads, k, v, index, tables))
        caches.append((k, v))
    fused.set_triton(True)
    torch.testing.assert_close(outs[0], outs[1], rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(caches[0][0], caches[1][0], rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(caches[0][1], caches[1][1], rtol=0, atol=0)
    assert caches[0][0][4:].abs().sum() == 0  # only the batch's rows were written
