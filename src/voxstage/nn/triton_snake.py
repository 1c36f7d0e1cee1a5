"""Triton kernel behind ``voxstage.nn.snake`` (imported only where Triton is installed: the GPU images, or the
CPU interpreter in ``tests/unit/codec/test_snake_interpret.py``).

PyTorch evaluates a Snake activation as a chain of about seven elementwise kernels (cast up, multiply, sin,
square, multiply, add, cast down), each writing a full fp32 ``[B, C, T]`` intermediate. In the codec decoders
those chains run at the widest tensors (up to C x 48000 samples per stream at 25 frames) and were most of the
decode's GPU time; this kernel reads ``x`` once and writes ``y`` once, with all the arithmetic in registers.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# Elements of one row per program: large enough for full-width vector loads on long rows; short rows (a
# one-frame decode sees T = 4 at the first block) get the next power of two so few lanes idle.
_MAX_BLOCK = 1024
_MIN_BLOCK = 64


@triton.jit
def snake_kernel(
    x_ptr,
    alpha_ptr,
    inv_ptr,
    out_ptr,
    channels,
    length,
    stride_b,
    stride_c,
    PLAIN: tl.constexpr,
    BLOCK: tl.constexpr,
):
    # One program per (row b*C + c, block of T): the channel's two scalars load once, not per element.
    row = tl.program_id(0)
    b = row // channels
    c = row % channels
    t = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = t < length
    alpha = tl.load(alpha_ptr + c).to(tl.float32)
    if PLAIN:
        # Plain Snake's 1/(alpha + 1e-9), with IEEE division as torch's reciprocal rounds it.
        inv = tl.math.div_rn(1.0, alpha + 1e-9)
    else:
        inv = tl.load(inv_ptr + c).to(tl.float32)
    # 64-bit row offsets: B*C*T passes 2^31 at ~100 streams of the final block.
    src = x_ptr + b.to(tl.int64) * stride_b + c.to(tl.int64) * stride_c
    x = tl.load(src + t, mask=mask, other=0.0).to(tl.float32)
    s = tl.sin(x * alpha)
    y = x + inv * (s * s)
    tl.store(out_ptr + row.to(tl.int64) * length + t, y.to(out_ptr.dtype.element_ty), mask=mask)


def snake(x: torch.Tensor, alpha: torch.Tensor, inv_beta: torch.Tensor | None) -> torch.Tensor:
    """``x + inv_beta * sin(x * alpha)^2`` for ``x [B, C, T]`` (fp32/bf16/fp16, any strides), computed in fp32
    and returned contiguous in ``x``'s dtype. ``alpha`` and ``inv_beta`` hold C contiguous values (e.g.
    ``[1, C, 1]``); ``inv_beta=None`` takes plain Snake's ``1 / (alpha + 1e-9)``."""
    batch, channels, length = x.shape
    if length > 1 and x.stride(2) != 1:
        x = x.contiguous()  # the kernel walks T with unit stride; B and C strides are free
    out = torch.empty((batch, channels, length), dtype=x.dtype, device=x.device)
    block = min(_MAX_BLOCK, max(_MIN_BLOCK, triton.next_power_of_2(length)))
    grid = (batch * channels, triton.cdiv(length, block))
    snake_kernel[grid](
        x, alpha, alpha if inv_beta is None else inv_beta, out,
        channels, length, x.stride(0), x.stride(1),
        PLAIN=inv_beta is None, BLOCK=block, num_warps=4 if block >= 512 else 1,
    )  # fmt: skip
    return out
