"""Family-specific convolutional blocks of the Audio8 codec, each runnable offline or as one streaming step.

The causal convs, ConvNeXt block and stream context are shared with the Qwen3-TTS codec
(``services.codec.stream_layers``); what stays here has this checkpoint's own math or names: plain-alpha
Snake (``alpha`` of shape ``[1, C, 1]``), and residual units and decoder blocks that keep their parts in a
``block`` list whose indices are the reference ``nn.Sequential`` indices.
"""

from __future__ import annotations

import torch
from torch import nn

from services.codec.stream_layers import CausalConv1d, CausalConvTranspose1d, StreamContext, run_blocks
from voxstage.nn.snake import snake


class Snake(nn.Module):
    """``x + 1/(alpha + 1e-9) * sin(alpha * x)^2`` with a plain (not log-scale) per-channel ``alpha``.

    Evaluated in at least fp32: ``sin`` of large arguments has no precision left in bf16.
    """

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.alpha = nn.Parameter(torch.ones(1, channels, 1))

    def forward(self, x: torch.Tensor, ctx: StreamContext | None = None) -> torch.Tensor:
        # The shared Snake op (one fused kernel on CUDA); without a scale it takes 1/(alpha + 1e-9) itself.
        return snake(x, self.alpha)


class Tanh(nn.Module):
    """``nn.Tanh`` that accepts (and ignores) a stream context, so a block list runs uniformly."""

    def forward(self, x: torch.Tensor, ctx: StreamContext | None = None) -> torch.Tensor:
        return torch.tanh(x)


class ResidualUnit(nn.Module):
    """``x + conv1x1(Snake(conv_k7_dil(Snake(x))))`` (``block.0..3``); causal, so no length change."""

    def __init__(self, dim: int, dilation: int) -> None:
        super().__init__()
        self.block = nn.ModuleList(
            [Snake(dim), CausalConv1d(dim, dim, 7, dilation=dilation), Snake(dim), CausalConv1d(dim, dim, 1)]
        )

    def forward(self, x: torch.Tensor, ctx: StreamContext | None = None) -> torch.Tensor:
        return x + run_blocks(self.block, x, ctx)


class DecoderBlock(nn.Module):
    """Snake, transposed conv (k=2s, s) from ``cin`` to ``cout``, residual units with dilation 1/3/9."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.block = nn.ModuleList(
            [Snake(cin), CausalConvTranspose1d(cin, cout, 2 * stride, stride)]
            + [ResidualUnit(cout, d) for d in (1, 3, 9)]
        )

    def forward(self, x: torch.Tensor, ctx: StreamContext | None = None) -> torch.Tensor:
        return run_blocks(self.block, x, ctx)
