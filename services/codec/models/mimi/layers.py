"""Causal conv building blocks of Mimi, each runnable offline or as one batched streaming step.

Offline (no :class:`StreamContext`) a block behaves like moshi's non-streaming pass: causal zero left
padding (or, for the stride-2 downsampler, the first input repeated), transposed convs trimmed on the right.
With a context the left padding is the stream's saved input history instead, and the new history is taken
at each row's *valid* end, so rows right-padded to a shared (B, T) bucket keep exactly their real history.
The history is read from, and rewritten into, the context's state in place (see ``state.py``).

Key nesting follows the kyutai checkpoint (``X.conv.conv.weight``, ``X.convtr.convtr.weight``): in training
the inner level was a weight-norm wrapper; the released weights are pre-folded into a plain conv.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .state import StreamContext


class ELU(nn.Module):
    """ELU (alpha 1) that accepts, and ignores, a stream context so SEANet can run one uniform loop."""

    def forward(self, x: torch.Tensor, ctx: StreamContext | None = None) -> torch.Tensor:
        return F.elu(x)


class _ConvCore(nn.Module):
    def __init__(self, conv: nn.Conv1d) -> None:
        super().__init__()
        self.conv = conv


class _ConvTrCore(nn.Module):
    def __init__(self, convtr: nn.ConvTranspose1d) -> None:
        super().__init__()
        self.convtr = convtr


class StreamConv1d(nn.Module):
    """Causal Conv1d: ``(k-1)*d + 1 - stride`` steps of left context, so T*stride inputs give T outputs.

    ``replicate`` pads with the stream's first input instead of zeros (moshi's downsampler); in streaming
    that first input is picked per row where the row's start frame is 0, by a select, not a branch.
    """

    def __init__(
        self,
        cin: int,
        cout: int,
        kernel: int,
        stride: int = 1,
        dilation: int = 1,
        groups: int = 1,
        bias: bool = True,
        replicate: bool = False,
    ) -> None:
        super().__init__()
        self.conv = _ConvCore(
            nn.Conv1d(cin, cout, kernel, stride=stride, dilation=dilation, groups=groups, bias=bias)
        )
        self.history = (kernel - 1) * dilation + 1 - stride
        if self.history < 0:
            raise ValueError(
                f"conv kernel {kernel} (dilation {dilation}) is shorter than its stride {stride}"
            )
        self.replicate = replicate
        self.state_key = ""

    def state_shapes(self) -> dict[str, tuple[int, ...]]:
        return {self.state_key: (self.conv.conv.in_channels, self.history)} if self.history else {}

    def forward(self, x: torch.Tensor, ctx: StreamContext | None = None) -> torch.Tensor:
        conv = self.conv.conv
        if self.history == 0:
            return conv(x)
        if ctx is None:
            if self.replicate:
                left = x[..., :1].expand(*x.shape[:-1], self.history)
                return conv(torch.cat([left, x], dim=-1))
            return conv(F.pad(x, (self.history, 0)))
        dest = ctx.history(self.state_key)
        past = dest
        if self.replicate:
            fresh = (ctx.start == 0)[:, None, None]
            past = torch.where(fresh, x[..., :1].expand_as(dest), dest)
        joined = torch.cat([past, x], dim=-1)
        ctx.keep_tail(dest, joined, dim=-1)
        return conv(joined)


class StreamConvTranspose1d(nn.Module):
    """ConvTranspose1d(k, s) with the last k-s outputs dropped: n inputs give exactly n*s outputs.

    Streaming keeps the last ``ceil(k/s) - 1`` *inputs* rather than moshi's partial outputs: re-running the
    transposed conv over them rebuilds the overlap with the offline arithmetic and adds the bias once.
    """

    def __init__(
        self, cin: int, cout: int, kernel: int, stride: int, groups: int = 1, bias: bool = True
    ) -> None:
        super().__init__()
        if kernel < stride:
            raise ValueError(f"transposed conv kernel {kernel} must be >= its stride {stride}")
        self.convtr = _ConvTrCore(
            nn.ConvTranspose1d(cin, cout, kernel, stride=stride, groups=groups, bias=bias)
        )
        self.stride = stride
        self.history = math.ceil(kernel / stride) - 1
        self.state_key = ""

    def state_shapes(self) -> dict[str, tuple[int, ...]]:
        return {self.state_key: (self.convtr.convtr.in_channels, self.history)} if self.history else {}

    def forward(self, x: torch.Tensor, ctx: StreamContext | None = None) -> torch.Tensor:
        convtr = self.convtr.convtr
        n = x.shape[-1]
        if ctx is None or self.history == 0:
            return convtr(x)[..., : n * self.stride]
        dest = ctx.history(self.state_key)
        joined = torch.cat([dest, x], dim=-1)
        ctx.keep_tail(dest, joined, dim=-1)
        begin = self.history * self.stride
        return convtr(joined)[..., begin : begin + n * self.stride]


class Downsample(nn.Module):
    """Learnt 25 -> 12.5 Hz conv (kernel 2*stride, no bias), padded with the first latent (moshi's
    ``ConvDownsample1d(learnt=True)``, key ``downsample.conv.conv.conv.weight``)."""

    def __init__(self, dim: int, stride: int) -> None:
        super().__init__()
        self.conv = StreamConv1d(dim, dim, 2 * stride, stride=stride, bias=False, replicate=True)

    def forward(self, x: torch.Tensor, ctx: StreamContext | None = None) -> torch.Tensor:
        return self.conv(x, ctx)


class Upsample(nn.Module):
    """Learnt depthwise 12.5 -> 25 Hz transposed conv (kernel 2*stride, groups=dim, no bias): moshi's
    ``ConvTrUpsample1d`` with its default channel-wise flag, key ``upsample.convtr.convtr.convtr.weight``."""

    def __init__(self, dim: int, stride: int) -> None:
        super().__init__()
        self.convtr = StreamConvTranspose1d(dim, dim, 2 * stride, stride, groups=dim, bias=False)

    def forward(self, x: torch.Tensor, ctx: StreamContext | None = None) -> torch.Tensor:
        return self.convtr(x, ctx)
