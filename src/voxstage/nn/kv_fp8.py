"""fp8 (e4m3) storage of a KV cache with static per-layer, per-head scales (``kv_cache_dtype: fp8``).

A stored value is ``fp8(clamp(x / scale, -448, 448))`` with ``x`` the K or V element the model-dtype cache
would hold; a read is ``fp8 * scale``. The scales are fixed at load, one per (layer, KV head) for K and for V,
derived from the weights alone (``linear_bounds`` / ``rope_pair_bounds``): a bound on ``|x|`` that no input
can exceed, rounded up to a power of two. Why this choice (docs/models.md, "fp8 KV cache" has the numbers):

* e4m3 is a float format: its relative rounding (at most 2^-4) is the same from 2^-6 to 448, so a scale only
  has to keep the bulk of the values above the subnormal range; a loose bound (tens of times the observed
  largest value) costs nothing measurable, while a tight calibrated one clips the first input that exceeds
  its calibration set.
* static, input-independent scales make every slot's bytes mean the same thing: slot moves, prefix-cache
  copies and the ring's overwrites are plain byte copies, and a session's numbers do not depend on which
  other sessions ran first (batched == alone still holds).
* powers of two make ``x / scale`` and ``fp8 * scale`` exact, so a kernel may fold the scale into q or the
  output instead of into K/V and still compute the same numbers as the PyTorch fallback.
"""

from __future__ import annotations

import math

import torch

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0  # the largest finite e4m3fn value; storing clamps to it (the GPU's saturating convert)


def is_fp8(dtype: torch.dtype) -> bool:
    return dtype == FP8


def as_bytes(x: torch.Tensor) -> torch.Tensor:
    """An fp8 tensor as its raw bytes (a view), anything else as is: gathers and scatters by index run on
    the bytes, which every device supports for every dtype."""
    return x.view(torch.uint8) if is_fp8(x.dtype) else x


def pow2_scale(bound: torch.Tensor) -> torch.Tensor:
    """The smallest power of two ``s`` with ``bound / s <= FP8_MAX`` (fp32, elementwise)."""
    b = bound.float().clamp(min=torch.finfo(torch.float32).tiny)
    return torch.exp2(torch.ceil(torch.log2(b / FP8_MAX)))


def quantize(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``x`` as stored in an fp8 pool; ``scale`` broadcasts against ``x`` (a power of two, fp32).

    ``x`` is first the value a model-dtype pool would hold (it arrives in the activation dtype), so the
    fp8 store is a function of the default path's store: one rounding, never a double one."""
    return (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8)


def dequantize(x: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Stored fp8 values back in ``dtype`` (exact: e4m3 values fit bf16/fp16/fp32, the scale is 2^k)."""
    return x.to(dtype) * scale.to(dtype)


def store(x: torch.Tensor, pool_dtype: torch.dtype, scale: torch.Tensor | None) -> torch.Tensor:
    """``x`` converted for a pool of ``pool_dtype``: a plain cast without scales (the default path)."""
    return x.to(pool_dtype) if scale is None else quantize(x, scale)


def load(x: torch.Tensor, dtype: torch.dtype, scale: torch.Tensor | None) -> torch.Tensor:
    """Pool values ``x`` read back in ``dtype``: a plain cast without scales (a no-op when equal)."""
    return x.to(dtype) if scale is None else dequantize(x, scale, dtype)


def linear_bounds(weight: torch.Tensor, norm: torch.Tensor | None) -> torch.Tensor:
    """Per output row j, a bound on ``|W (u * norm)|_j`` over every RMS-normalised input ``u`` (``mean(u^2)
    <= 1``, so ``|u|_2 <= sqrt(in)``): Cauchy-Schwarz gives ``|W_j * norm|_2 sqrt(in)``. Computed in fp32
    (``weight [out, in]``, ``norm [in]`` or None for an unscaled norm)."""
    w = weight.float()
    if norm is not None:
        w = w * norm.float().reshape(1, -1)
    return torch.linalg.vector_norm(w, dim=1) * math.sqrt(weight.shape[1])


def rope_pair_bounds(bounds: torch.Tensor, interleaved: bool) -> torch.Tensor:
    """Per-element bounds ``[..., hd]`` of a head's vector -> a bound on its elements after a rotation of
    pairs (RoPE): a rotated element is at most the pair's length. Interleaved pairs are (2i, 2i+1), rotate-
    half pairs (i, i + hd/2)."""
    if interleaved:
        pairs = bounds.unflatten(-1, (-1, 2))
        length = torch.linalg.vector_norm(pairs, dim=-1)
        return length.repeat_interleave(2, dim=-1)
    lo, hi = bounds.chunk(2, dim=-1)
    length = torch.sqrt(lo * lo + hi * hi)
    return torch.cat([length, length], dim=-1)


def head_scales(bounds: torch.Tensor, heads: int) -> torch.Tensor:
    """Per-element bounds ``[heads * hd]`` -> one power-of-two scale per head ``[heads]``."""
    return pow2_scale(bounds.reshape(heads, -1).amax(dim=-1))
