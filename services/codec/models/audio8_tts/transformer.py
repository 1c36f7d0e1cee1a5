"""The codec's window-limited causal transformers (``post_module``, ``pre_module``, the encoder's last block).

Per layer: ``x + γ_a·attn(RMSNorm(x))`` then ``+ γ_f·SwiGLU(RMSNorm(·))``; a final RMSNorm; no input/output
projections (the width equals the latent). Checkpoint names: ``layers.N.attention.{wqkv,wo}``,
``layers.N.feed_forward.{w1,w2,w3}``, ``layers.N.{attention_norm,ffn_norm}``,
``layers.N.{attention,ffn}_layer_scale.gamma``, ``norm``.

Attention: one fused ``wqkv`` (q | k | v, no bias), grouped-query heads (query head h reads kv head
``h // (heads / kv_heads)``), interleaved (GPT-J) RoPE with base 1e4 whose cos/sin table is rounded to bf16
as the reference stores it (the rotation itself runs in fp32), and a causal window: a query at position p
sees keys in ``(p - window, p]``. Positions are absolute frame indices, so a streamed step sees exactly
the offline angles; a stream keeps the last ``window - 1`` post-RoPE keys/values of every layer.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn

from services.codec import stream_layers
from services.codec.stream_layers import PrenormParts, StreamContext, WindowKVAttention, prenorm_layers_fused
from voxstage.nn import fused
from voxstage.nn.layers import FusedLinears, RMSNorm

from .config import TransformerGeometry


def rope_table(positions: torch.Tensor, head_dim: int, base: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin ``positions.shape + (head_dim // 2,)`` in **bf16**: fp32 angles ``p * base^(-2i/d)``, rounded
    to bf16 as the reference's table is (vllm-omni: an fp32 table shifts the output audibly)."""
    exponents = torch.arange(0, head_dim, 2, device=positions.device).float() / head_dim
    inv_freq = 1.0 / (base**exponents)
    angles = positions.to(torch.float32).unsqueeze(-1) * inv_freq
    return angles.cos().to(torch.bfloat16), angles.sin().to(torch.bfloat16)


def apply_interleaved_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the pairs ``(x[2i], x[2i+1])`` of ``x`` [B, T, H, D] by the table [B|1, T, D/2], in fp32."""
    pairs = x.float().unflatten(-1, (-1, 2))
    even, odd = pairs[..., 0], pairs[..., 1]
    c = cos.float()[:, :, None, :]
    s = sin.float()[:, :, None, :]
    return torch.stack((even * c - odd * s, odd * c + even * s), dim=-1).flatten(-2).to(x.dtype)


def window_mask(q_pos: torch.Tensor, k_pos: torch.Tensor, window: int) -> torch.Tensor:
    """Boolean ``[B|1, 1, 1, Tq, Tk]``: the shared window mask with the two broadcast dims (kv head, group)
    of :class:`Attention`'s grouped layout."""
    return stream_layers.window_mask(q_pos, k_pos, window, head_dims=2)


class Attention(WindowKVAttention):
    """Fused ``wqkv``, interleaved bf16-table RoPE and grouped-query heads; the K/V history and the eager
    attention itself are :class:`WindowKVAttention`'s."""

    def __init__(self, geom: TransformerGeometry) -> None:
        super().__init__(geom.heads, geom.kv_heads, geom.head_dim, geom.window)
        self.rope_base = geom.rope_base
        self.wqkv = nn.Linear(geom.dim, (geom.heads + 2 * geom.kv_heads) * geom.head_dim, bias=False)
        self.wo = nn.Linear(geom.heads * geom.head_dim, geom.dim, bias=False)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        mask: torch.Tensor,
        ctx: StreamContext | None = None,
    ) -> torch.Tensor:
        b, t, _ = x.shape
        hd, kvh = self.head_dim, self.kv_heads
        qkv = self.wqkv(x).view(b, t, self.heads + 2 * kvh, hd)
        # One rotary pass over q and k together (elementwise per head, so the same values): half the kernels.
        q, k = apply_interleaved_rope(qkv[:, :, : self.heads + kvh], cos, sin).split((self.heads, kvh), dim=2)
        k, v = self.with_history(k.transpose(1, 2), qkv[:, :, self.heads + kvh :].transpose(1, 2), ctx)
        # Queries grouped per kv head ([B, KV, G, T, D]) broadcast against [B, KV, 1, Tk, D]: GQA without
        # materialising repeated keys/values.
        q = q.transpose(1, 2).reshape(b, kvh, self.heads // kvh, t, hd)
        out = self.attend(q, k.unsqueeze(2), v.unsqueeze(2), mask)  # [B, KV, G, T, D]
        return self.wo(out.reshape(b, self.heads, t, hd).transpose(1, 2).reshape(b, t, self.heads * hd))


class FeedForward(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)  # gate
        self.w3 = nn.Linear(dim, hidden, bias=False)  # up
        self.w2 = nn.Linear(hidden, dim, bias=False)  # down
        self._gate_up: FusedLinears | None = None

    def fuse(self) -> None:
        """Gate and up in one tensor, one GEMM (after the model is placed: moving it replaced them)."""
        self._gate_up = FusedLinears(self.w1, self.w3)

    def _gate_up_weight(self) -> torch.Tensor | None:
        return self._gate_up.weight() if self._gate_up is not None else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_up = self._gate_up_weight()
        if gate_up is None:
            return self.w2(F.silu(self.w1(x)) * self.w3(x))
        gate, up = F.linear(x, gate_up).chunk(2, dim=-1)
        return self.w2(F.silu(gate) * up)

    def forward_fused(self, h: torch.Tensor) -> torch.Tensor:
        """On rows ``h [N, D]`` with the SiLU-product as one kernel (``voxstage.nn.fused``)."""
        gate_up = self._gate_up_weight()
        if gate_up is None:
            return self(h)
        return self.w2(fused.silu_mul(F.linear(h, gate_up)))


class LayerScale(nn.Module):
    def __init__(self, dim: int, init: float) -> None:
        super().__init__()
        self.gamma = nn.Parameter(torch.full((dim,), init))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gamma


class TransformerBlock(nn.Module):
    def __init__(self, geom: TransformerGeometry) -> None:
        super().__init__()
        self.attention = Attention(geom)
        self.feed_forward = FeedForward(geom.dim, geom.ffn)
        self.attention_norm = RMSNorm(geom.dim, geom.norm_eps)
        self.ffn_norm = RMSNorm(geom.dim, geom.norm_eps)
        self.attention_layer_scale = LayerScale(geom.dim, geom.layer_scale_init)
        self.ffn_layer_scale = LayerScale(geom.dim, geom.layer_scale_init)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        mask: torch.Tensor,
        ctx: StreamContext | None = None,
    ) -> torch.Tensor:
        x = x + self.attention_layer_scale(self.attention(self.attention_norm(x), cos, sin, mask, ctx))
        return x + self.ffn_layer_scale(self.feed_forward(self.ffn_norm(x)))

    def fused_parts(
        self, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor, ctx: StreamContext | None
    ) -> PrenormParts:
        attend = functools.partial(self.attention, cos=cos, sin=sin, mask=mask, ctx=ctx)
        parts = (self.attention_norm, attend, self.attention_layer_scale, self.ffn_norm)
        return PrenormParts(*parts, self.feed_forward.forward_fused, self.ffn_layer_scale)


class WindowTransformer(nn.Module):
    """Channels-first in and out (``[B, C, T]``), as it sits between convs."""

    def __init__(self, geom: TransformerGeometry) -> None:
        super().__init__()
        self.geom = geom
        self.layers = nn.ModuleList(TransformerBlock(geom) for _ in range(geom.layers))
        self.norm = RMSNorm(geom.dim, geom.norm_eps)

    def forward(self, x: torch.Tensor, ctx: StreamContext | None = None) -> torch.Tensor:
        """Offline pass from position 0 (``ctx`` must be None: streaming goes through :meth:`step`)."""
        if ctx is not None:
            raise RuntimeError("WindowTransformer streams through step(), which needs frame positions")
        pos = torch.arange(x.shape[-1], device=x.device)[None]
        return self.step(x, pos, window_mask(pos, pos, self.geom.window), None)

    def step(
        self, x: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor, ctx: StreamContext | None
    ) -> torch.Tensor:
        """``x`` [B, C, T]; ``positions`` [B|1, T] absolute frame indices; ``mask`` from
        :func:`window_mask`."""
        cos, sin = rope_table(positions, self.geom.head_dim, self.geom.rope_base)
        h = x.transpose(1, 2)
        if fused.kernels_active(h):
            parts = [layer.fused_parts(cos, sin, mask, ctx) for layer in self.layers]
            return prenorm_layers_fused(h, parts, self.norm).transpose(1, 2)
        for layer in self.layers:
            h = layer(h, cos, sin, mask, ctx)
        return self.norm(h).transpose(1, 2)
