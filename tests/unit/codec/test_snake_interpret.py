"""The fused Snake kernel (``voxstage.nn.triton_snake``) against the PyTorch formula, run on CPU tensors by
Triton's interpreter; and the CPU fallback of ``voxstage.nn.snake`` against the decoders' own formulas.

The kernel tests need Triton (``PYTHONPATH`` with a Triton install; the CI image has none and skips them).
The interpreter evaluates numpy float32 math where the GPU evaluates libdevice's, and truncates fp32 -> bf16
where the GPU rounds to nearest, so bf16 is held to one bf16 step of the fp32 result rather than bit equality.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest
import torch

from services.codec.models.audio8_tts.layers import Snake
from services.codec.models.qwen3_tts.layers import SnakeBeta
from voxstage.nn import snake as snake_op

SnakeFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor | None], torch.Tensor]


@pytest.fixture(scope="module")
def kernel() -> SnakeFn:
    """``triton_snake.snake`` from a private copy of the module decorated under ``TRITON_INTERPRET=1``: the
    JIT decides interpreter vs compiler when the kernel is decorated, and the package's copy may already be
    compiled for CUDA in this process."""
    pytest.importorskip("triton")
    path = Path(snake_op.__file__).with_name("triton_snake.py")
    saved = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        spec = importlib.util.spec_from_file_location("_triton_snake_interpreted", path)
        assert spec is not None and spec.loader is not None
        module: ModuleType = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        if saved is None:
            del os.environ["TRITON_INTERPRET"]
        else:
            os.environ["TRITON_INTERPRET"] = saved
    return module.snake  # type: ignore[no-any-return]


def reference(x: torch.Tensor, alpha: torch.Tensor, inv_beta: torch.Tensor | None) -> torch.Tensor:
    """The formula in fp32 (no rounding to ``x``'s dtype), per channel of ``[B, C, T]``."""
    xw, a = x.float(), alpha.float().reshape(1, -1, 1)
    inv = (a + 1e-9).reciprocal() if inv_beta is None else inv_beta.float().reshape(1, -1, 1)
    return xw + inv * torch.sin(xw * a).pow(2)


def scales(channels: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """SnakeBeta-like ``e^alpha`` and ``1/e^beta`` over a wide range (log-scales in [-2, 2])."""
    gen = torch.Generator().manual_seed(seed)
    alpha = (torch.rand(channels, generator=gen) * 4 - 2).exp()
    inv_beta = 1.0 / (torch.rand(channels, generator=gen) * 4 - 2).exp()
    return alpha, inv_beta


def activations(shape: tuple[int, int, int], seed: int, scale: float) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)) * scale


# (B, C, T): T below, at and past the 1024 block and a tail; odd C; T = 1 (a one-sample row).
SHAPES = [(2, 5, 1000), (1, 3, 2500), (3, 7, 37), (2, 1, 1024), (1, 3, 1)]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("scale", [1.0, 300.0])  # 300: sin arguments in the thousands (range reduction)
def test_fp32_matches_formula(kernel: SnakeFn, shape: tuple[int, int, int], scale: float) -> None:
    x = activations(shape, 0, scale)
    alpha, inv_beta = scales(shape[1], 1)
    y = kernel(x, alpha, inv_beta)
    assert y.dtype == torch.float32 and y.shape == x.shape and y.is_contiguous()
    # sin differs by an ulp between numpy and torch; scaled by inv_beta (up to e^2) on top of |x|.
    torch.testing.assert_close(y, reference(x, alpha, inv_beta), rtol=1e-6, atol=1e-5)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("plain", [False, True])
def test_bf16_within_one_rounding(kernel: SnakeFn, shape: tuple[int, int, int], plain: bool) -> None:
    x = activations(shape, 2, 100.0).bfloat16()
    alpha, inv_beta = scales(shape[1], 3)
    inv = None if plain else inv_beta
    y = kernel(x, alpha, inv)
    assert y.dtype == torch.bfloat16
    exact = reference(x, alpha, inv)
    # One bf16 step at |exact| (8 significant bits): what any single rounding of the fp32 result may move.
    step = torch.exp2(torch.floor(torch.log2(exact.abs().clamp_min(1e-30))) - 7)
    assert ((y.float() - exact).abs() <= step).all()


def test_plain_snake_scale(kernel: SnakeFn) -> None:
    """``inv_beta=None``: the kernel's own 1/(alpha + 1e-9), including alpha near 0 (scale ~1e9)."""
    x = activations((2, 4, 300), 4, 3.0)
    alpha = torch.tensor([1.0, 0.25, 7.5, 1e-4])
    torch.testing.assert_close(kernel(x, alpha, None), reference(x, alpha, None), rtol=1e-6, atol=1e-5)


@pytest.mark.parametrize("layout", ["sliced", "transposed"])
def test_strided_input(kernel: SnakeFn, layout: str) -> None:
    """A cropped conv output (row strides larger than T) runs in place of its strides; a transposed one
    (unit stride not on T) is copied first. Both give the contiguous result."""
    base = activations((3, 9, 700), 5, 20.0)
    x = base[:, 2:7, 50:650] if layout == "sliced" else base.transpose(1, 2).contiguous().transpose(1, 2)
    assert not x.is_contiguous()
    alpha, inv_beta = scales(x.shape[1], 6)
    y = kernel(x, alpha, inv_beta)
    assert y.is_contiguous()
    torch.testing.assert_close(y, reference(x, alpha, inv_beta), rtol=1e-6, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_cpu_fallback_is_the_modules_formula(dtype: torch.dtype) -> None:
    """On the CPU ``snake()`` is the formula both decoders evaluated before, op for op: bit-identical."""
    x = activations((2, 6, 50), 7, 30.0).to(dtype)
    beta_snake = SnakeBeta(6)
    plain = Snake(6)
    with torch.no_grad():
        beta_snake.alpha.uniform_(-1, 1)
        beta_snake.beta.uniform_(-1, 1)
        plain.alpha.uniform_(0.2, 3)
    wide = torch.promote_types(dtype, torch.float32)
    xw = x.to(wide)
    with torch.no_grad():
        a = beta_snake.alpha.to(wide).exp()[None, :, None]
        inv = 1.0 / (beta_snake.beta.to(wide).exp()[None, :, None] + 1e-9)
        expected_beta = (xw + inv * torch.sin(xw * a).pow(2)).to(dtype)
        p = plain.alpha.to(wide)
        expected_plain = (xw + (p + 1e-9).reciprocal() * torch.sin(p * xw).pow(2)).to(dtype)
        assert torch.equal(beta_snake(x), expected_beta)
        assert torch.equal(plain(x), expected_plain)
