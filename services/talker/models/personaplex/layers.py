"""Building blocks shared by the Helium temporal transformer and the depformer (moshi's conventions).

RMSNorm keeps its scale as ``alpha`` ``[1, 1, dim]`` and adds ``eps`` to the mean square, in fp32; RoPE
rotates interleaved (real, imaginary) pairs at absolute positions (``voxstage.nn.fused.rope_rotate``); the
feed-forward is a SiLU-gated linear unit whose input projection holds gate then up rows. Parameter names
equal the checkpoint's; the math lives in ``voxstage.nn.fused`` (one kernel each on the GPU).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from voxstage.nn.fused import add_rmsnorm


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-8) -> None:
        super().__init__()
        self.eps = eps
        self.alpha = nn.Parameter(torch.ones(1, 1, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _, y = add_rmsnorm(x.reshape(-1, x.shape[-1]), None, self.alpha, self.eps)
        return y.view_as(x)


class Gating(nn.Module):
    """SiLU-gated FFN: ``linear_in`` rows are [gate | up] (one GEMM), ``linear_out`` maps back."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.linear_in = nn.Linear(dim, 2 * hidden, bias=False)
        self.linear_out = nn.Linear(hidden, dim, bias=False)


def rope_tables(
    positions: torch.Tensor, head_dim: int, max_period: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin ``[*positions.shape, head_dim // 2]`` (fp32) for absolute ``positions``: built once per step
    and shared by every layer."""
    ds = torch.arange(head_dim // 2, device=positions.device, dtype=torch.float32)
    freqs = torch.exp(ds * (-math.log(max_period) * 2 / head_dim))
    angles = positions.to(torch.float32).unsqueeze(-1) * freqs
    return torch.cos(angles), torch.sin(angles)
