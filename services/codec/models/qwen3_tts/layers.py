"""Family-specific building blocks of the 12 Hz code2wav decoder, each runnable offline or as one streaming
step.

The causal convs, ConvNeXt block, stream context and the window attention's K/V history are shared with the
Audio8 codec (``services.codec.stream_layers``); what stays here has this checkpoint's own math or names
(SnakeBeta, named residual units, separate q/k/v projections with rotate-half RoPE and repeated K/V heads).
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn

from services.codec.stream_layers import (
    CausalConv1d,
    CausalConvTranspose1d,
    PrenormParts,
    StreamContext,
    WindowKVAttention,
    run_blocks,
)
from voxstage.nn import fused
from voxstage.nn.layers import FusedLinears, RMSNorm, SwiGLU, apply_rope
from voxstage.nn.snake import snake

from .config import Qwen3DecoderConfig


class SnakeBeta(nn.Module):
    """x + 1/(e^beta + 1e-9) * sin^2(x * e^alpha), with per-channel log-scale alpha/beta.

    Computed in at least fp32 whatever the activation dtype: sin of large arguments loses all precision
    in bf16, and at fp32 this is exactly the reference formula.
    """

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.alpha = nn.Parameter(torch.zeros(channels))
        self.beta = nn.Parameter(torch.zeros(channels))
        self._scales: tuple[tuple[object, ...], torch.Tensor, torch.Tensor] | None = None

    def scales(self, wide: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """``e^alpha`` and ``1/(e^beta + 1e-9)`` as ``[1, C, 1]``, computed once per weight version: per call
        they were ~380 of a decode's kernels. The same ops as the formula, so the values are identical."""
        if torch.is_grad_enabled() and self.alpha.requires_grad:
            return self._compute(wide)  # training: keep the graph back to the parameters
        try:
            # Weights change in place (load_state_dict) or by moving (.to): either changes this key.
            key = (self.alpha._version, self.beta._version, self.alpha.data_ptr(), self.beta.data_ptr(), wide)
        except RuntimeError:  # inference tensors keep no version counter: no safe cache key
            return self._compute(wide)
        if self._scales is None or self._scales[0] != key:
            with torch.no_grad():
                self._scales = (key, *self._compute(wide))
        return self._scales[1], self._scales[2]

    def _compute(self, wide: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        alpha = self.alpha.to(wide).exp()[None, :, None]
        beta = self.beta.to(wide).exp()[None, :, None]
        return alpha, 1.0 / (beta + 1e-9)

    def forward(self, x: torch.Tensor, ctx: StreamContext | None = None) -> torch.Tensor:
        # On CUDA one fused kernel (``voxstage.nn.snake``) instead of ~7 elementwise launches per call.
        return snake(x, *self.scales(torch.promote_types(x.dtype, torch.float32)))


class ResidualUnit(nn.Module):
    def __init__(self, dim: int, dilation: int) -> None:
        super().__init__()
        self.act1 = SnakeBeta(dim)
        self.conv1 = CausalConv1d(dim, dim, 7, dilation=dilation)
        self.act2 = SnakeBeta(dim)
        self.conv2 = CausalConv1d(dim, dim, 1)

    def forward(self, x: torch.Tensor, ctx: StreamContext | None = None) -> torch.Tensor:
        h = self.conv1(self.act1(x), ctx)
        return x + self.conv2(self.act2(h), ctx)


class DecoderBlock(nn.Module):
    """SnakeBeta, transposed conv (k=2r, s=r) halving the channels, then residual units (dil 1/3/9)."""

    def __init__(self, cin: int, cout: int, rate: int) -> None:
        super().__init__()
        units: list[nn.Module] = [SnakeBeta(cin), CausalConvTranspose1d(cin, cout, 2 * rate, rate)]
        units += [ResidualUnit(cout, d) for d in (1, 3, 9)]
        self.block = nn.ModuleList(units)

    def forward(self, x: torch.Tensor, ctx: StreamContext | None = None) -> torch.Tensor:
        return run_blocks(self.block, x, ctx)


class LayerScale(nn.Module):
    def __init__(self, dim: int, init: float) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.full((dim,), init))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.scale * x


class WindowAttention(WindowKVAttention):
    """Causal sliding-window attention with RoPE; a query sees itself and the ``window - 1`` frames before.

    That is the reference mask ``q - window < k <= q`` (transformers' sliding-window overlay); the K/V history
    and the attention itself (eager on the CPU, SDPA on CUDA) are :class:`WindowKVAttention`'s.
    """

    def __init__(self, cfg: Qwen3DecoderConfig) -> None:
        super().__init__(cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cfg.sliding_window)
        bias = cfg.attention_bias
        self.q_proj = nn.Linear(cfg.hidden_size, self.heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(cfg.hidden_size, self.kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(cfg.hidden_size, self.kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.heads * self.head_dim, cfg.hidden_size, bias=bias)
        self._qkv: FusedLinears | None = None

    def fuse_projections(self) -> None:
        """Put q/k/v's weights in one tensor (their parameters become views of it) so a call runs one GEMM
        instead of three; done after the model is placed, since moving it replaces the parameters. Biased
        projections stay separate."""
        if self.q_proj.bias is None:
            self._qkv = FusedLinears(self.q_proj, self.k_proj, self.v_proj)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        mask: torch.Tensor,
        ctx: StreamContext | None = None,
    ) -> torch.Tensor:
        b, t, _ = x.shape
        h, kvh, d = self.heads, self.kv_heads, self.head_dim
        fused = self._qkv.weight() if self._qkv is not None else None
        if fused is None:
            qkv = torch.cat([self.q_proj(x), self.k_proj(x), self.v_proj(x)], dim=-1)
        else:
            qkv = F.linear(x, fused)
        qkv = qkv.view(b, t, h + 2 * kvh, d).transpose(1, 2)
        # One rotary pass over q and k together (elementwise per head, so the same values): half the kernels.
        q, k = apply_rope(qkv[:, : h + kvh], cos, sin).split([h, kvh], dim=1)
        k, v = self.with_history(k, qkv[:, h + kvh :], ctx)
        out = self.attend_heads(q, k, v, mask)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, self.heads * self.head_dim))


class TransformerLayer(nn.Module):
    def __init__(self, cfg: Qwen3DecoderConfig) -> None:
        super().__init__()
        self.self_attn = WindowAttention(cfg)
        self.mlp = SwiGLU(cfg.hidden_size, cfg.intermediate_size)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn_layer_scale = LayerScale(cfg.hidden_size, cfg.layer_scale_initial_scale)
        self.mlp_layer_scale = LayerScale(cfg.hidden_size, cfg.layer_scale_initial_scale)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        mask: torch.Tensor,
        ctx: StreamContext | None = None,
    ) -> torch.Tensor:
        x = x + self.self_attn_layer_scale(self.self_attn(self.input_layernorm(x), cos, sin, mask, ctx))
        return x + self.mlp_layer_scale(self.mlp(self.post_attention_layernorm(x)))

    def fuse_projections(self) -> None:
        """One GEMM for q/k/v and one for gate/up (after the model is placed: moving it replaced them)."""
        self.self_attn.fuse_projections()
        self.mlp.fuse()

    def fused_parts(
        self, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor, ctx: StreamContext | None
    ) -> PrenormParts:
        attend = functools.partial(self.self_attn, cos=cos, sin=sin, mask=mask, ctx=ctx)
        norms = (self.input_layernorm, self.post_attention_layernorm)
        scales = (self.self_attn_layer_scale, self.mlp_layer_scale)
        return PrenormParts(norms[0], attend, scales[0], norms[1], self.mlp_fused, scales[1])

    def mlp_fused(self, h: torch.Tensor) -> torch.Tensor:
        """SwiGLU on rows ``h [N, H]`` with the SiLU-product as one kernel (``voxstage.nn.fused``)."""
        gate_up = self.mlp.gate_up_weight()
        if gate_up is None:
            return self.mlp(h)
        return self.mlp.down_proj(fused.silu_mul(F.linear(h, gate_up)))
