"""Snake activations of the TTS codec decoders: one Triton kernel on CUDA, plain PyTorch elsewhere.

The kernel (``triton_snake.py``) runs when the tensor is on CUDA, Triton imports and the switch that all fused
kernels share (``voxstage.nn.fused.set_triton``) is on; the PyTorch fallback is the exact formula, op for op,
the decoders evaluated before, so CPU golden parity does not depend on which path a test takes.
"""

from __future__ import annotations

from types import ModuleType

import torch

from voxstage.nn import fused


def _load() -> ModuleType | None:
    return fused.load_triton_module("triton_snake")


def triton_available() -> bool:
    return _load() is not None


def _kernel_for(x: torch.Tensor, params: tuple[torch.Tensor, ...]) -> ModuleType | None:
    """The kernel module if this call may use it: CUDA, switched on, fp32 arithmetic (not fp64), a 3-D
    non-empty input, and no autograd graph to build (the kernel has no backward)."""
    if not x.is_cuda or not fused.enabled() or x.dim() != 3 or x.numel() == 0:
        return None
    if x.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        return None
    if torch.is_grad_enabled() and any(t.requires_grad for t in (x, *params)):
        return None
    if any(t.numel() != x.shape[1] or not t.is_contiguous() for t in params):
        return None
    return _load()


def snake(x: torch.Tensor, alpha: torch.Tensor, inv_beta: torch.Tensor | None = None) -> torch.Tensor:
    """``x + inv_beta * sin(x * alpha)^2`` per channel of ``x [B, C, T]``, in at least fp32 whatever the
    activation dtype (sin of large arguments has no precision left in bf16), returned in ``x``'s dtype.

    ``alpha``/``inv_beta`` broadcast over ``x`` as ``[1, C, 1]``. ``inv_beta=None`` is plain Snake, whose
    scale is ``1 / (alpha + 1e-9)`` of the same ``alpha``.
    """
    params = (alpha,) if inv_beta is None else (alpha, inv_beta)
    kernels = _kernel_for(x, params)
    if kernels is not None:
        return kernels.snake(x, alpha, inv_beta)
    wide = torch.promote_types(x.dtype, torch.float32)
    xw = x.to(wide)
    alpha = alpha.to(wide)
    inv = (alpha + 1e-9).reciprocal() if inv_beta is None else inv_beta.to(wide)
    return (xw + inv * torch.sin(xw * alpha).pow(2)).to(x.dtype)
