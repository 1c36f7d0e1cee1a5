"""Fused glue ops of a per-token step, with plain PyTorch fallbacks.

On CUDA with Triton installed (GPU images), each op is one kernel (``triton_kernels.py``); elsewhere (CPU,
the CI machine) the PyTorch code runs, which is also the reference the kernels are tested against on the
GPU. The fallbacks are written in the exact operation order of moshi's modules, so CPU golden parity does not
depend on which path a test takes.
"""

from __future__ import annotations

import functools
from types import ModuleType

import torch
from torch.nn import functional as F

_enabled = True


@functools.cache
def _load() -> ModuleType | None:
    try:
        from voxstage.nn import triton_kernels
    except ImportError:  # no Triton (CPU-only torch): the PyTorch fallbacks run
        return None
    return triton_kernels


def _kernels() -> ModuleType | None:
    return _load() if _enabled else None


def set_triton(enabled: bool) -> bool:
    """Switch the Triton kernels on or off (benchmarks compare both; tests check one against the other);
    returns the previous setting. Graphs captured before keep the path they captured."""
    global _enabled
    previous, _enabled = _enabled, enabled
    return previous


def triton_available() -> bool:
    return _load() is not None


def add_rmsnorm(
    x: torch.Tensor, delta: torch.Tensor | None, alpha: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(s, norm(s))`` with ``s = x + delta`` (or ``x``) for rows ``[N, D]``: the residual stream after a
    block and the next block's normalised input. RMSNorm in fp32: ``s * (alpha * rsqrt(eps + mean s^2))``."""
    kernels = _kernels() if x.is_cuda else None
    if kernels is None:
        s = x if delta is None else x + delta
        s32 = s.float()
        var = eps + torch.mean(s32 * s32, dim=-1, keepdim=True)
        return s, (s32 * (alpha.reshape(-1).float() * torch.rsqrt(var))).to(s.dtype)
    rows, cols = x.shape
    out = torch.empty_like(x)
    s = x if delta is None else torch.empty_like(x)
    d = x if delta is None else delta
    kernels.add_rmsnorm_kernel[(rows,)](
        x, d, alpha, s, out, x.stride(0), d.stride(0), s.stride(0), out.stride(0), cols, eps,
        HAS_DELTA=delta is not None, BLOCK=_pow2(cols),
    )  # fmt: skip
    return s, out


def silu_mul(y: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` for rows ``[N, 2H]`` holding [gate | up]."""
    kernels = _kernels() if y.is_cuda else None
    if kernels is None:
        gate, up = y.unflatten(-1, (2, -1)).unbind(-2)
        return F.silu(gate) * up
    rows, width = y.shape
    hidden = width // 2
    out = torch.empty(rows, hidden, device=y.device, dtype=y.dtype)
    block = 1024
    kernels.silu_mul_kernel[(rows, triton_cdiv(hidden, block))](
        y, out, y.stride(0), out.stride(0), hidden, BLOCK=block
    )
    return out


def qkv_into_cache(
    qkv: torch.Tensor,
    heads: int,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    index: torch.Tensor,
    rope: tuple[torch.Tensor, torch.Tensor] | None,
) -> torch.Tensor:
    """Split ``qkv [B, 3*H*hd]`` (one token per row), rotate q and k by interleaved RoPE (``rope`` = cos,
    sin ``[B, hd/2]`` fp32; None: no rotation), write k and v into row b's cache at ``index[b]``
    (caches ``[>=B, H, positions, hd]``) and return q ``[B, H, hd]``."""
    b = qkv.shape[0]
    kernels = _kernels() if qkv.is_cuda else None
    if kernels is None:
        q, k, v = qkv.unflatten(-1, (3, heads, -1)).unbind(1)
        if rope is not None:
            q, k = rope_rotate(q, *rope), rope_rotate(k, *rope)
        rows = torch.arange(b, device=qkv.device)
        k_cache[rows, :, index] = k
        v_cache[rows, :, index] = v
        return q
    head_dim = qkv.shape[1] // (3 * heads)
    q = torch.empty(b, heads, head_dim, device=qkv.device, dtype=qkv.dtype)
    cos, sin = rope if rope is not None else (qkv, qkv)  # unused without RoPE
    kernels.rope_kv_kernel[(b, heads)](
        qkv, cos, sin, index, q, k_cache, v_cache,
        qkv.stride(0), heads * head_dim, cos.stride(0), q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        HALF=head_dim // 2, ROPE=rope is not None,
    )  # fmt: skip
    return q


def rope_rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Interleaved RoPE of ``x [B, H, hd]`` by tables ``[B, hd/2]`` in fp32 (moshi's ``apply_rope`` order)."""
    pairs = x.unflatten(-1, (-1, 2)).float()
    re, im = pairs[..., 0], pairs[..., 1]
    c, s = cos.unsqueeze(1), sin.unsqueeze(1)
    return torch.stack((re * c - im * s, re * s + im * c), dim=-1).to(x.dtype).flatten(-2)


def _pow2(n: int) -> int:
    return 1 << (n - 1).bit_length()


def triton_cdiv(a: int, b: int) -> int:
    return -(-a // b)
