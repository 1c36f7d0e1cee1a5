"""Layers that several model families share: RMSNorm, SwiGLU MLP and rotary embeddings."""

from __future__ import annotations

import torch
from torch import nn


class RMSNorm(nn.Module):
    """Qwen/Llama RMSNorm: the statistics are computed in fp32 whatever the activation dtype."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.is_cuda and x.dtype != torch.float32:
            # One fused kernel instead of eight: norms run ~4 times per layer and ~100 layers per frame, so on
            # a GPU they dominate the launch count. It accumulates in fp32 too; results differ from the
            # unfused form by at most one bf16 rounding step.
            return nn.functional.rms_norm(x, (x.shape[-1],), self.weight.to(x.dtype), self.eps)
        dtype = x.dtype
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(dtype)


class FusedLinears:
    """Bias-free linears on one input whose weights are row blocks of a single tensor: one GEMM instead of
    several (on a GPU each launch counts: these run ~100 times per frame).

    The modules keep their own ``weight`` parameters (checkpoint names, strict loading, state dicts and
    in-place initialisation all work unchanged): they are views into the concatenated tensor. If something
    replaces or moves a parameter afterwards (``module.to(...)`` after construction), the views are no
    longer intact and ``weight()`` returns ``None``: callers fall back to the separate projections.
    """

    def __init__(self, *linears: nn.Linear) -> None:
        if any(lin.bias is not None for lin in linears):
            raise ValueError("only bias-free linears can be fused")
        # Rows copied into one new tensor rather than torch.cat: under a ``with torch.device(...)`` block
        # (how stages build their models) torch.cat goes through a Python path that imports torch._dynamo,
        # 1.3 s of every codec start.
        first = linears[0].weight
        fused = first.new_empty((sum(lin.out_features for lin in linears), first.shape[1]))
        start = 0
        with torch.no_grad():
            for lin in linears:
                n = lin.out_features
                fused[start : start + n].copy_(lin.weight)
                lin.weight = nn.Parameter(fused[start : start + n], requires_grad=lin.weight.requires_grad)
                start += n
        self._fused = fused
        self._linears = linears

    def weight(self) -> torch.Tensor | None:
        ptr, size = self._fused.data_ptr(), self._fused.element_size()
        start = 0
        for lin in self._linears:
            w = lin.weight
            if w.data_ptr() != ptr + start * w.shape[1] * size or w.dtype != self._fused.dtype:
                return None
            start += w.shape[0]
        return self._fused


class SwiGLU(nn.Module):
    """gate/up/down MLP with SiLU gating (checkpoint names ``gate_proj``, ``up_proj``, ``down_proj``)."""

    def __init__(self, dim: int, hidden: int, bias: bool = False) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(dim, hidden, bias=bias)
        self.up_proj = nn.Linear(dim, hidden, bias=bias)
        self.down_proj = nn.Linear(hidden, dim, bias=bias)
        self._gate_up = None if bias else FusedLinears(self.gate_proj, self.up_proj)

    def fuse(self) -> None:
        """Put gate and up in one tensor again (after moving the module replaced its parameters)."""
        if self.gate_proj.bias is None:
            self._gate_up = FusedLinears(self.gate_proj, self.up_proj)

    def gate_up_weight(self) -> torch.Tensor | None:
        """``[gate; up]`` as one weight (one GEMM gives ``[gate | up]``), or None if it is not intact."""
        return self._gate_up.weight() if self._gate_up is not None else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        fused = self.gate_up_weight()
        if fused is None:
            return self.down_proj(nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))
        gate, up = nn.functional.linear(x, fused).chunk(2, dim=-1)
        return self.down_proj(nn.functional.silu(gate) * up)


def rope_inv_freq(head_dim: int, theta: float, device: torch.device | str | None = None) -> torch.Tensor:
    """Inverse frequencies of NeoX-style (rotate-half) RoPE, in fp32."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64, device=device).float() / head_dim
    return 1.0 / (theta**exponents)


def rope_cos_sin(
    positions: torch.Tensor, inv_freq: torch.Tensor, dtype: torch.dtype
) -> tuple[torch.Tensor, ...]:
    """cos/sin tables for integer ``positions`` (any shape) -> shape ``positions.shape + (head_dim,)``.

    The angles are formed in fp32 at absolute positions, as the reference implementations do, so a
    streamed computation at position p gives bit-for-bit the same table as a whole-sequence one.
    """
    freqs = positions.to(torch.float32).unsqueeze(-1) * inv_freq.to(positions.device)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Apply rotate-half RoPE; ``cos``/``sin`` broadcast against ``x`` (``[..., T, head_dim]``)."""
    return x * cos + rotate_half(x) * sin
