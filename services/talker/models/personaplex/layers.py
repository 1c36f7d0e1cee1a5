"""Building blocks shared by the Helium temporal transformer and the depformer (moshi's conventions).

RMSNorm keeps its scale as ``alpha`` ``[1, 1, dim]`` and adds ``eps`` to the mean square, in fp32; RoPE
rotates interleaved (real, imaginary) pairs at absolute positions; the feed-forward is a SiLU-gated linear
unit whose input projection holds gate then up rows. Parameter names equal the checkpoint's.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-8) -> None:
        super().__init__()
        self.eps = eps
        self.alpha = nn.Parameter(torch.ones(1, 1, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.is_cuda and x.dtype != torch.float32:
            # One fused kernel instead of six; it also accumulates in fp32 and differs from the unfused form
            # by at most one rounding of the (bf16) output.
            y = F.rms_norm(x.float(), (x.shape[-1],), self.alpha.reshape(-1).float(), self.eps)
            return y.to(x.dtype)
        # The reference order, which the fp32 golden parity depends on: x * (alpha * rsqrt(eps + mean x^2)).
        x32 = x.float()
        var = self.eps + torch.mean(x32 * x32, dim=-1, keepdim=True)
        return (x32 * (self.alpha.reshape(-1).float() * torch.rsqrt(var))).to(x.dtype)


class Gating(nn.Module):
    """SiLU-gated FFN: ``linear_in`` rows are [gate | up] (one GEMM), ``linear_out`` maps back."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.linear_in = nn.Linear(dim, 2 * hidden, bias=False)
        self.linear_out = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return gated(x, self.linear_in.weight, self.linear_out.weight)


def gated(x: torch.Tensor, w_in: torch.Tensor, w_out: torch.Tensor) -> torch.Tensor:
    y = F.linear(x, w_in)
    gate, up = y.unflatten(-1, (2, -1)).unbind(-2)
    return F.linear(F.silu(gate) * up, w_out)


def rope_tables(
    positions: torch.Tensor, head_dim: int, max_period: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin ``[*positions.shape, head_dim // 2]`` (fp32) for absolute ``positions``: built once per step
    and shared by every layer."""
    ds = torch.arange(head_dim // 2, device=positions.device, dtype=torch.float32)
    freqs = torch.exp(ds * (-math.log(max_period) * 2 / head_dim))
    angles = positions.to(torch.float32).unsqueeze(-1) * freqs
    return torch.cos(angles), torch.sin(angles)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate interleaved pairs of ``x [B, T, H, D]`` by tables ``[B, T, D/2]`` (computed in fp32)."""
    pairs = x.unflatten(-1, (-1, 2)).float()
    re, im = pairs[..., 0], pairs[..., 1]
    c, s = cos.unsqueeze(-2), sin.unsqueeze(-2)
    out = torch.stack((re * c - im * s, re * s + im * c), dim=-1)
    return out.to(x.dtype).flatten(-2)
