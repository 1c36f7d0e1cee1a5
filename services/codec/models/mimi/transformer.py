"""Mimi's two 25 Hz transformers (after the SEANet encoder, before the SEANet decoder).

Pre-norm layers (LayerNorm, eps 1e-5), fused ``in_proj_weight`` (q|k|v, heads-major) with interleaved RoPE
at absolute step positions (angles in fp32, as moshi), causal attention over a ``context``-step window,
GELU MLP without biases, and LayerScale on both residual branches. Parameter names follow the kyutai
checkpoint (``transformer.layers.N.self_attn.in_proj_weight``, ``...out_proj.weight``, ``norm1``,
``linear1``, ``layer_scale_1.scale``...).

Window semantics. moshi's non-streaming pass lets step ``p`` see steps ``p - context < k <= p``. Its
streaming pass (what the reference server runs, one 80 ms frame = ``S`` steps per call) keeps a ring of
exactly ``context`` keys, so after a frame is written the first step of that frame sees one key fewer:
step ``p`` sees ``k >= S * (p // S) + S - context``. The two agree until the ring first wraps (frame
``context / S``, 10 s). This module implements both with one rule, ``k >= A * (p // A) + A - context``:
``A = S`` (default, frame-aligned, equals moshi's frame-by-frame streaming at any chunking) or ``A = 1``
(``full_window=True``: moshi's offline pass). Streaming keeps ``context - S`` post-RoPE keys/values per
layer, which is all the frame-aligned window can reach.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .config import TransformerConfig
from .layers import StreamContext


def attention_mask(q_pos: torch.Tensor, k_pos: torch.Tensor, context: int, align: int) -> torch.Tensor:
    """Boolean ``[B, 1, Tq, Tk]`` (True = attend) for absolute step positions ``q_pos`` [B|1, Tq] and
    ``k_pos`` [B|1, Tk]: causal, ``k >= align * (q // align) + align - context``, and ``k >= 0`` (the
    zero history of a fresh stream is never seen, as in the offline pass)."""
    q = q_pos[:, None, :, None]
    k = k_pos[:, None, None, :]
    first = torch.div(q, align, rounding_mode="floor") * align + (align - context)
    return (k <= q) & (k >= first) & (k >= 0)


def rope_tables(
    positions: torch.Tensor, head_dim: int, max_period: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin ``[B, 1, T, head_dim / 2]`` in fp32 for integer positions ``[B, T]``.

    Built in fp32 exactly like the reference (``exp(i * -2 ln(max_period) / D)`` times the float position),
    so streamed steps get bit-identical angles to offline ones at the same absolute position.
    """
    half = head_dim // 2
    freqs = torch.exp(
        torch.arange(half, device=positions.device, dtype=torch.float32)
        * (-math.log(max_period) * 2 / head_dim)
    )
    angles = positions.to(torch.float32)[:, None, :, None] * freqs
    return torch.cos(angles), torch.sin(angles)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate interleaved (real, imag) pairs of the last dim of ``x`` [B, H, T, D]; math in fp32."""
    pairs = x.float().unflatten(-1, (-1, 2))
    re, im = pairs[..., 0], pairs[..., 1]
    out = torch.stack([re * cos - im * sin, re * sin + im * cos], dim=-1)
    return out.flatten(-2).to(x.dtype)


class MimiAttention(nn.Module):
    """Causal multi-head self-attention with a fused, bias-free q|k|v projection."""

    def __init__(self, d_model: int, num_heads: int, history: int) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = d_model // num_heads
        self.history = history
        self.in_proj_weight = nn.Parameter(torch.empty(3 * d_model, d_model))
        self.out_proj = nn.Linear(d_model, d_model, bias=False)
        self.state_key = ""

    def state_shapes(self) -> dict[str, tuple[int, ...]]:
        shape = (self.num_heads, self.history, self.head_dim)
        return {f"{self.state_key}.k": shape, f"{self.state_key}.v": shape}

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        mask: torch.Tensor,
        ctx: StreamContext | None = None,
    ) -> torch.Tensor:
        b, t, d = x.shape
        qkv = F.linear(x, self.in_proj_weight).view(b, t, 3, self.num_heads, self.head_dim)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
        q = apply_rope(q, cos, sin)
        k = apply_rope(k, cos, sin)
        if ctx is not None:
            k = torch.cat([ctx.history(f"{self.state_key}.k"), k], dim=2)
            v = torch.cat([ctx.history(f"{self.state_key}.v"), v], dim=2)
            ctx.keep_tail(f"{self.state_key}.k", k, self.history, dim=2)
            ctx.keep_tail(f"{self.state_key}.v", v, self.history, dim=2)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.out_proj(out.transpose(1, 2).reshape(b, t, d))


class LayerScale(nn.Module):
    def __init__(self, dim: int, init: float) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.full((dim,), init))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.scale * x


class TransformerLayer(nn.Module):
    def __init__(self, cfg: TransformerConfig, history: int) -> None:
        super().__init__()
        d = cfg.d_model
        self.self_attn = MimiAttention(d, cfg.num_heads, history)
        self.norm1 = nn.LayerNorm(d, eps=1e-5)
        self.norm2 = nn.LayerNorm(d, eps=1e-5)
        self.linear1 = nn.Linear(d, cfg.dim_feedforward, bias=False)
        self.linear2 = nn.Linear(cfg.dim_feedforward, d, bias=False)
        scale = cfg.layer_scale
        self.layer_scale_1: nn.Module = nn.Identity() if scale is None else LayerScale(d, scale)
        self.layer_scale_2: nn.Module = nn.Identity() if scale is None else LayerScale(d, scale)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        mask: torch.Tensor,
        ctx: StreamContext | None = None,
    ) -> torch.Tensor:
        x = x + self.layer_scale_1(self.self_attn(self.norm1(x), cos, sin, mask, ctx))
        return x + self.layer_scale_2(self.linear2(F.gelu(self.linear1(self.norm2(x)))))


class _LayerStack(nn.Module):
    def __init__(self, cfg: TransformerConfig, history: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(TransformerLayer(cfg, history) for _ in range(cfg.num_layers))


class ProjectedTransformer(nn.Module):
    """``[B, C, T]`` -> ``[B, C, T]`` at 25 Hz; in/out projections only where ``d_model`` differs from C
    (the released model has none)."""

    def __init__(self, cfg: TransformerConfig, steps_per_frame: int) -> None:
        super().__init__()
        self.cfg = cfg
        self.steps_per_frame = steps_per_frame
        self.history = cfg.context - steps_per_frame
        self.transformer = _LayerStack(cfg, self.history)
        self.input_proj: nn.Linear | None = None
        if cfg.input_dimension != cfg.d_model:
            self.input_proj = nn.Linear(cfg.input_dimension, cfg.d_model, bias=False)
        self.output_projs = nn.ModuleList(
            nn.Identity() if dim == cfg.d_model else nn.Linear(cfg.d_model, dim, bias=False)
            for dim in cfg.output_dimensions
        )

    def forward(
        self, x: torch.Tensor, ctx: StreamContext | None = None, full_window: bool = False
    ) -> torch.Tensor:
        h = x.transpose(1, 2)
        if self.input_proj is not None:
            h = self.input_proj(h)
        steps = h.shape[1]
        ar = torch.arange(steps, device=h.device)
        s = self.steps_per_frame
        if ctx is None:
            q_pos = k_pos = ar[None]
            mask = attention_mask(q_pos, k_pos, self.cfg.context, 1 if full_window else s)
        else:
            if full_window:
                raise ValueError("full_window applies to offline passes only; streaming is frame-aligned")
            first = ctx.start[:, None] * s
            q_pos = first + ar
            k_pos = first - self.history + torch.arange(self.history + steps, device=h.device)
            mask = attention_mask(q_pos, k_pos, self.cfg.context, s)
        cos, sin = rope_tables(q_pos, self.cfg.head_dim, self.cfg.max_period)
        for layer in self.transformer.layers:
            h = layer(h, cos, sin, mask, ctx)
        return self.output_projs[0](h).transpose(1, 2)
