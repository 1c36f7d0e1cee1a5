"""Fused glue ops of a per-token step, with plain PyTorch fallbacks.

On CUDA with Triton installed (GPU images), each op is one kernel (``triton_kernels.py``); elsewhere (CPU,
the CI machine) the PyTorch code runs, which is also the reference the kernels are tested against on the
GPU. The fallbacks are written in the exact operation order of the modules they stand for (moshi's, Qwen3's),
so CPU golden parity does not depend on which path a test takes.
"""

from __future__ import annotations

import functools
import importlib
from types import ModuleType

import torch
from torch.nn import functional as F

from voxstage.nn import kv_fp8
from voxstage.nn.layers import RMSNorm, apply_rope

_enabled = True


@functools.cache
def load_triton_module(name: str) -> ModuleType | None:
    """``voxstage.nn.<name>`` (a module of Triton kernels), or None where Triton does not import (CPU-only
    torch): its callers then run their PyTorch forms."""
    try:
        return importlib.import_module(f"voxstage.nn.{name}")
    except ImportError:
        return None


def _load() -> ModuleType | None:
    return load_triton_module("triton_kernels")


def _kernels() -> ModuleType | None:
    return _load() if _enabled else None


def _kernels_for(t: torch.Tensor) -> ModuleType | None:
    """The kernels to run on ``t``'s device, or None for the PyTorch path. (The interpreter tests swap this
    to run the kernels on CPU tensors.)"""
    return _kernels() if t.is_cuda else None


def kernels_active(t: torch.Tensor) -> bool:
    """Whether the ops below run as Triton kernels on ``t``: callers restructure around them (e.g. fuse a
    residual add into the next block's norm) only then, so the PyTorch path keeps its exact numerics."""
    return _kernels_for(t) is not None


def set_triton(enabled: bool) -> bool:
    """Switch the Triton kernels on or off (benchmarks compare both; tests check one against the other);
    returns the previous setting. Graphs captured before keep the path they captured."""
    global _enabled
    previous, _enabled = _enabled, enabled
    return previous


def enabled() -> bool:
    """Whether the Triton kernels are switched on (``set_triton``); every fused op in ``voxstage.nn`` and the
    talker's pool attention follow this one switch."""
    return _enabled


def triton_available() -> bool:
    return _load() is not None


def add_rmsnorm(
    x: torch.Tensor, delta: torch.Tensor | None, alpha: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(s, norm(s))`` with ``s = x + delta`` (or ``x``) for rows ``[N, D]``: the residual stream after a
    block and the next block's normalised input. RMSNorm in fp32: ``s * (alpha * rsqrt(eps + mean s^2))``."""
    kernels = _kernels_for(x)
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
    kernels = _kernels_for(y)
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
    scales: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """Split ``qkv [B, 3*H*hd]`` (one token per row), rotate q and k by interleaved RoPE (``rope`` = cos,
    sin ``[B, hd/2]`` fp32; None: no rotation), write k and v into row b's cache at ``index[b]``
    (caches ``[>=B, H, positions, hd]``) and return q ``[B, H, hd]``. ``scales`` ``(k_scale, v_scale)
    [H]``: the caches are fp8 and take ``k / k_scale``, ``v / v_scale`` (``voxstage.nn.kv_fp8``)."""
    b = qkv.shape[0]
    kernels = _kernels_for(qkv)
    if kernels is None:
        q, k, v = qkv.unflatten(-1, (3, heads, -1)).unbind(1)
        if rope is not None:
            q, k = rope_rotate(q, *rope), rope_rotate(k, *rope)
        rows = torch.arange(b, device=qkv.device)
        if scales is None:
            k_cache[rows, :, index] = k
            v_cache[rows, :, index] = v
        else:
            k8, v8 = kv_fp8.quantize(k, scales[0].view(-1, 1)), kv_fp8.quantize(v, scales[1].view(-1, 1))
            kv_fp8.as_bytes(k_cache)[rows, :, index] = kv_fp8.as_bytes(k8)
            kv_fp8.as_bytes(v_cache)[rows, :, index] = kv_fp8.as_bytes(v8)
        return q
    if index.shape != (b,):
        raise ValueError(f"qkv_into_cache: index must be [B] = [{b}], got {list(index.shape)}")
    head_dim = qkv.shape[1] // (3 * heads)
    q = torch.empty(b, heads, head_dim, device=qkv.device, dtype=qkv.dtype)
    cos, sin = rope if rope is not None else (qkv, qkv)  # unused without RoPE
    k_scale, v_scale = scales if scales is not None else (qkv, qkv)  # unused without fp8
    kernels.rope_kv_kernel[(b, heads)](
        qkv, cos, sin, index, q, k_cache, v_cache, k_scale, v_scale,
        qkv.stride(0), heads * head_dim, index.stride(0), cos.stride(0), q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        HALF=head_dim // 2, ROPE=rope is not None, FP8=scales is not None, FP8_MAX=kv_fp8.FP8_MAX,
    )  # fmt: skip
    return q


def qk_norm_rope_into_cache(
    qkv: torch.Tensor,
    heads: int,
    kv_heads: int,
    q_norm: RMSNorm,
    k_norm: RMSNorm,
    cos: torch.Tensor,
    sin: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    slot: torch.Tensor,
    pos: torch.Tensor,
    scales: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """Qwen3 attention's input side for tokens ``qkv [N, (heads + 2 * kv_heads) * hd]``: per-head q/k
    RMSNorm, rotate-half RoPE by ``cos``/``sin [N, hd]`` (activation dtype), k and v written into one layer's
    pools ``[slots, kv_heads, positions, hd]`` at ``(slot[n], :, pos[n])``; returns q ``[N, heads, hd]``.
    The fallback is the unfused module code (RMSNorm modules, ``apply_rope``, index_put). ``scales``
    ``(k_scale, v_scale) [kv_heads]``: the pools are fp8 (``voxstage.nn.kv_fp8``)."""
    n = qkv.shape[0]
    hd = qkv.shape[1] // (heads + 2 * kv_heads)
    kernels = _kernels_for(qkv)
    if kernels is None:
        q, k, v = qkv.unflatten(1, (heads + 2 * kv_heads, hd)).split([heads, kv_heads, kv_heads], dim=1)
        q, k = q_norm(q), k_norm(k)
        q, k = apply_rope(torch.cat([q, k], dim=1), cos.unsqueeze(1), sin.unsqueeze(1)).split(
            [heads, kv_heads], dim=1
        )
        if scales is None:
            k_pool[slot, :, pos] = k.to(k_pool.dtype)
            v_pool[slot, :, pos] = v.to(v_pool.dtype)
        else:
            k8, v8 = kv_fp8.quantize(k, scales[0].view(-1, 1)), kv_fp8.quantize(v, scales[1].view(-1, 1))
            kv_fp8.as_bytes(k_pool)[slot, :, pos] = kv_fp8.as_bytes(k8)
            kv_fp8.as_bytes(v_pool)[slot, :, pos] = kv_fp8.as_bytes(v8)
        return q
    if slot.shape != (n,) or pos.shape != (n,):
        raise ValueError(f"qk_norm_rope_into_cache: slot and pos must be [N] = [{n}] (any stride)")
    if (
        qkv.stride(1) != 1
        or cos.stride() != sin.stride()
        or cos.stride(1) != 1
        or k_pool.stride() != v_pool.stride()
        or k_pool.stride(3) != 1
        or q_norm.eps != k_norm.eps
    ):
        raise ValueError("qk_norm_rope_into_cache: rows must be dense, the pools alike, the norms' eps equal")
    q = torch.empty(n, heads, hd, device=qkv.device, dtype=qkv.dtype)
    k_scale, v_scale = scales if scales is not None else (qkv, qkv)  # unused without fp8
    kernels.qk_norm_rope_kv_kernel[(n, heads + kv_heads)](
        qkv, q_norm.weight, k_norm.weight, cos, sin, slot, pos, q, k_pool, v_pool, k_scale, v_scale,
        qkv.stride(0), slot.stride(0), pos.stride(0), cos.stride(0), q.stride(0), q.stride(1),
        k_pool.stride(0), k_pool.stride(1), k_pool.stride(2), q_norm.eps,
        NH=heads, NKV=kv_heads, HALF=hd // 2, BLOCK=_pow2(hd // 2), FP8=scales is not None,
        FP8_MAX=kv_fp8.FP8_MAX,
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
