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
from .state import StreamContext


def attention_mask(q_pos: torch.Tensor, k_pos: torch.Tensor, context: int, align: int) -> torch.Tensor:
    """Boolean ``[B, 1, Tq, Tk]`` (True = attend) for absolute step positions ``q_pos`` [B|1, Tq] and
    ``k_pos`` [B|1, Tk]: causal, ``k >= align * (q // align) + align - context``, and ``k >= 0`` (the
    zero history of a fresh stream is never seen, as in the offline pass)."""
    q = q_pos[:, None, :, None]
    k = k_pos[:, None, None, :]
    first = torch.div(q, align, rounding_mode="floor") * align + (align - context)
    return (k <= q) & (k >= first.clamp_(min=0))


def attention_bias(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The 0 / -inf additive form of ``mask``: exactly what SDPA derives from a boolean mask, built once per
    call instead of in every layer. The storage's last dim is padded to a multiple of 16 so that CUDA's
    memory-efficient kernel takes the bias as it is rather than re-padding it per layer."""
    *lead, tk = mask.shape
    storage = torch.full((*lead, -(-tk // 16) * 16), float("-inf"), dtype=dtype, device=mask.device)
    bias = storage[..., :tk]
    return bias.masked_fill_(mask, 0.0)


def rope_rotation(positions: torch.Tensor, head_dim: int, max_period: float) -> torch.Tensor:
    """Unit rotations ``cos + i sin`` (complex64) ``[B, T, 1, 1, head_dim / 2]`` for integer positions
    ``[B, T]``, shaped to broadcast over a ``[B, T, 2, H, head_dim / 2]`` q|k view.

    Angles in fp32 exactly like the reference (``exp(i * -2 ln(max_period) / D)`` times the float position),
    so streamed steps get bit-identical angles to offline ones at the same absolute position.
    """
    half = head_dim // 2
    freqs = torch.exp(
        torch.arange(half, device=positions.device, dtype=torch.float32)
        * (-math.log(max_period) * 2 / head_dim)
    )
    angles = positions.to(torch.float32)[:, :, None] * freqs
    return torch.complex(torch.cos(angles), torch.sin(angles))[:, :, None, None, :]


def rotate_qk_(qkv: torch.Tensor, rot: torch.Tensor) -> None:
    """Rotate the interleaved (real, imag) pairs of the q and k thirds of ``qkv`` [B, T, 3, H, D] in place.

    One complex multiply covers q and k of every head: ``(re + i im)(cos + i sin)`` is the reference's
    ``(re cos - im sin, re sin + im cos)`` term for term. Math in fp32; other dtypes round-trip through it.
    """
    qk = qkv[:, :, :2]
    if qk.dtype == torch.float32:
        torch.view_as_complex(qk.unflatten(-1, (-1, 2))).mul_(rot)
        return
    z = torch.view_as_complex(qk.float().unflatten(-1, (-1, 2)))
    qk.copy_(torch.view_as_real(z.mul_(rot)).flatten(-2))


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
        # K then V, back to back: the step carries them as one [2, H, history, D] block.
        shape = (self.num_heads, self.history, self.head_dim)
        return {f"{self.state_key}.k": shape, f"{self.state_key}.v": shape}

    def forward(
        self, x: torch.Tensor, rot: torch.Tensor, bias: torch.Tensor, ctx: StreamContext | None = None
    ) -> torch.Tensor:
        b, t, d = x.shape
        qkv = F.linear(x, self.in_proj_weight).view(b, t, 3, self.num_heads, self.head_dim)
        rotate_qk_(qkv, rot)
        q = qkv[:, :, 0].transpose(1, 2)
        kv = qkv[:, :, 1:].permute(0, 2, 3, 1, 4)  # [B, 2, H, T, D]
        if ctx is not None:
            past = ctx.history_pair(f"{self.state_key}.k", f"{self.state_key}.v")
            kv = torch.cat([past, kv], dim=3)
            ctx.keep_tail(past, kv, dim=3)
        k, v = kv.unbind(1)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
        return self.out_proj(out.transpose(1, 2).reshape(b, t, d))


class LayerScale(nn.Module):
    def __init__(self, dim: int, init: float) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.full((dim,), init))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.scale * x


def _add_scaled(x: torch.Tensor, scale: nn.Module, h: torch.Tensor) -> torch.Tensor:
    """``x + scale(h)`` in one kernel where ``scale`` is a LayerScale (may round once instead of twice)."""
    if isinstance(scale, LayerScale):
        return torch.addcmul(x, scale.scale, h)
    return x + scale(h)


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
        rot: torch.Tensor,
        bias: torch.Tensor,
        ctx: StreamContext | None = None,
    ) -> torch.Tensor:
        x = _add_scaled(x, self.layer_scale_1, self.self_attn(self.norm1(x), rot, bias, ctx))
        return _add_scaled(x, self.layer_scale_2, self.linear2(F.gelu(self.linear1(self.norm2(x)))))


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
        # Contiguous once here: elementwise ops keep a transposed input's layout, and then every LayerNorm
        # would copy its input to make it contiguous.
        h = x.transpose(1, 2).contiguous()
        if self.input_proj is not None:
            h = self.input_proj(h)
        steps = h.shape[1]
        s = self.steps_per_frame
        if ctx is None:
            q_pos = k_pos = torch.arange(steps, device=h.device)[None]
            mask = attention_mask(q_pos, k_pos, self.cfg.context, 1 if full_window else s)
        else:
            if full_window:
                raise ValueError("full_window applies to offline passes only; streaming is frame-aligned")
            first = ctx.start[:, None] * s
            q_pos = first + torch.arange(steps, device=h.device)
            k_pos = first + torch.arange(-self.history, steps, device=h.device)
            mask = attention_mask(q_pos, k_pos, self.cfg.context, s)
        # Shared by every layer: built once per call.
        bias = attention_bias(mask, h.dtype)
        rot = rope_rotation(q_pos, self.cfg.head_dim, self.cfg.max_period)
        for layer in self.transformer.layers:
            h = layer(h, rot, bias, ctx)
        return self.output_projs[0](h).transpose(1, 2)
