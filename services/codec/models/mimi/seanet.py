"""SEANet encoder (24 kHz PCM -> 25 Hz latents) and decoder (latents -> PCM) of Mimi.

Both are stacks of causal convs with ELU and single-conv residual blocks; the module lists reproduce the
kyutai checkpoint indices (``encoder.model.N``, ``decoder.model.N``; activations occupy indices too), so the
released weights load strictly. Every layer takes an optional stream context (see ``layers.py``).
"""

from __future__ import annotations

import torch
from torch import nn

from .config import SeanetConfig
from .layers import ELU, StreamConv1d, StreamConvTranspose1d
from .state import StreamContext


class ResnetBlock(nn.Module):
    """ELU -> conv k (dim -> dim/compress, dilated) -> ELU -> conv 1 (back to dim), plus the skip path."""

    def __init__(self, dim: int, kernel: int, dilation: int, compress: int, true_skip: bool) -> None:
        super().__init__()
        hidden = dim // compress
        self.block = nn.ModuleList(
            [ELU(), StreamConv1d(dim, hidden, kernel, dilation=dilation), ELU(), StreamConv1d(hidden, dim, 1)]
        )
        # The released model uses the identity skip; the learnt 1x1 skip exists for config fidelity.
        self.shortcut: StreamConv1d | None = None if true_skip else StreamConv1d(dim, dim, 1)

    def forward(self, x: torch.Tensor, ctx: StreamContext | None = None) -> torch.Tensor:
        h = x
        for layer in self.block:
            h = layer(h, ctx)
        skip = x if self.shortcut is None else self.shortcut(x, ctx)
        return skip + h


def _res_blocks(dim: int, cfg: SeanetConfig) -> list[nn.Module]:
    return [
        ResnetBlock(dim, cfg.residual_kernel_size, cfg.dilation_base**j, cfg.compress, cfg.true_skip)
        for j in range(cfg.n_residual_layers)
    ]


class SEANetEncoder(nn.Module):
    """``[B, 1, N]`` PCM -> ``[B, dimension, N / hop]``: downsampling by ``reversed(ratios)``."""

    def __init__(self, cfg: SeanetConfig) -> None:
        super().__init__()
        nf = cfg.n_filters
        layers: list[nn.Module] = [StreamConv1d(cfg.channels, nf, cfg.kernel_size)]
        mult = 1
        for ratio in reversed(cfg.ratios):
            layers += _res_blocks(mult * nf, cfg)
            layers += [ELU(), StreamConv1d(mult * nf, 2 * mult * nf, 2 * ratio, stride=ratio)]
            mult *= 2
        layers += [ELU(), StreamConv1d(mult * nf, cfg.dimension, cfg.last_kernel_size)]
        self.model = nn.ModuleList(layers)

    def forward(self, x: torch.Tensor, ctx: StreamContext | None = None) -> torch.Tensor:
        for layer in self.model:
            x = layer(x, ctx)
        return x


class SEANetDecoder(nn.Module):
    """``[B, dimension, T]`` latents -> ``[B, 1, T * hop]`` PCM: upsampling by ``ratios``."""

    def __init__(self, cfg: SeanetConfig) -> None:
        super().__init__()
        nf = cfg.n_filters
        mult = 2 ** len(cfg.ratios)
        layers: list[nn.Module] = [StreamConv1d(cfg.dimension, mult * nf, cfg.kernel_size)]
        for ratio in cfg.ratios:
            layers += [ELU(), StreamConvTranspose1d(mult * nf, mult * nf // 2, 2 * ratio, ratio)]
            layers += _res_blocks(mult * nf // 2, cfg)
            mult //= 2
        layers += [ELU(), StreamConv1d(nf, cfg.channels, cfg.last_kernel_size)]
        self.model = nn.ModuleList(layers)

    def forward(self, x: torch.Tensor, ctx: StreamContext | None = None) -> torch.Tensor:
        for layer in self.model:
            x = layer(x, ctx)
        return x
