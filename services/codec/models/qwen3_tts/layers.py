"""Building blocks of the 12 Hz code2wav decoder, each runnable offline or as one streaming step.

Every block takes an optional :class:`StreamContext`. Without one it behaves like the reference (causal
zero left-padding, positions from 0). With one, the left padding is replaced by the stream's saved history
and the new history is written back, so chunked decoding reproduces the single-pass result. The history is
taken at each row's *valid* end, which lets a batch carry right-padded rows (fewer new frames than the
bucket's T) without corrupting their state.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from voxstage.nn.layers import RMSNorm, SwiGLU, apply_rope

from .config import Qwen3DecoderConfig


class StreamContext:
    """State in/out of one streaming call for a batch of streams.

    ``state_in`` maps a state key to its ``[B, ...]`` history; blocks put their new history in ``state_out``.
    ``lengths`` ([B], int64) counts the valid new frames of each row; ``frames`` is the padded T, a Python
    int, so every block can derive its own time scale from static shapes alone.
    """

    def __init__(self, state_in: dict[str, torch.Tensor], lengths: torch.Tensor, frames: int) -> None:
        self.state_in = state_in
        self.state_out: dict[str, torch.Tensor] = {}
        self.lengths = lengths
        self.frames = frames
        # Blocks at the same rate with the same history length share their gather indices.
        self._starts: dict[tuple[int, int], torch.Tensor] = {}

    def history(self, key: str) -> torch.Tensor:
        try:
            return self.state_in[key]
        except KeyError as exc:
            raise KeyError(f"streaming state has no entry {key!r}") from exc

    def keep_tail(self, key: str, joined: torch.Tensor, size: int, dim: int) -> None:
        """Save the ``size`` steps of ``joined`` (history ++ new) that end at each row's valid end.

        A gather rather than a slice per row keeps the step free of host syncs (graph capture) and lets
        right-padded rows keep the history that ends at their last real frame.
        """
        scale = (joined.shape[dim] - size) // self.frames
        steps = self._starts.get((scale, size))
        if steps is None:
            steps = self.lengths[:, None] * scale + torch.arange(size, device=joined.device)
            self._starts[(scale, size)] = steps
        view = [1] * joined.dim()
        view[0], view[dim] = joined.shape[0], size
        shape = list(joined.shape)
        shape[dim] = size
        self.state_out[key] = torch.gather(joined, dim, steps.view(view).expand(shape))


class CausalConv1d(nn.Module):
    """Stride-1 conv with (k-1)*d zeros of left padding (checkpoint name ``.conv``).

    For stride 1 the reference's extra right padding is always zero, so output length equals input length.
    """

    def __init__(self, cin: int, cout: int, kernel: int, dilation: int = 1, groups: int = 1) -> None:
        super().__init__()
        self.conv = nn.Conv1d(cin, cout, kernel, dilation=dilation, groups=groups)
        self.history = (kernel - 1) * dilation
        self.state_key = ""

    def state_shapes(self) -> dict[str, tuple[int, ...]]:
        return {self.state_key: (self.conv.in_channels, self.history)} if self.history else {}

    def forward(self, x: torch.Tensor, ctx: StreamContext | None = None) -> torch.Tensor:
        if self.history == 0:
            return self.conv(x)
        if ctx is None:
            return self.conv(F.pad(x, (self.history, 0)))
        joined = torch.cat([ctx.history(self.state_key), x], dim=-1)
        ctx.keep_tail(self.state_key, joined, self.history, dim=joined.dim() - 1)
        return self.conv(joined)


class CausalConvTranspose1d(nn.Module):
    """ConvTranspose1d(k, s) with the last k-s outputs dropped, so n inputs give exactly n*s outputs.

    Streaming keeps the last ceil(k/s)-1 *inputs* (not the overlapping outputs): re-running the transposed
    conv over them reproduces the overlap with the same arithmetic as the offline pass, bias added once.
    """

    def __init__(self, cin: int, cout: int, kernel: int, stride: int) -> None:
        super().__init__()
        if kernel < stride:
            raise ValueError(f"transposed conv kernel {kernel} must be >= stride {stride}")
        self.conv = nn.ConvTranspose1d(cin, cout, kernel, stride=stride)
        self.stride = stride
        self.history = math.ceil(kernel / stride) - 1
        self.state_key = ""

    def state_shapes(self) -> dict[str, tuple[int, ...]]:
        return {self.state_key: (self.conv.in_channels, self.history)} if self.history else {}

    def forward(self, x: torch.Tensor, ctx: StreamContext | None = None) -> torch.Tensor:
        n = x.shape[-1]
        if self.history == 0 or ctx is None:
            return self.conv(x)[..., : n * self.stride]
        joined = torch.cat([ctx.history(self.state_key), x], dim=-1)
        ctx.keep_tail(self.state_key, joined, self.history, dim=joined.dim() - 1)
        start = self.history * self.stride
        return self.conv(joined)[..., start : start + n * self.stride]


class SnakeBeta(nn.Module):
    """x + 1/(e^beta + 1e-9) * sin^2(x * e^alpha), with per-channel log-scale alpha/beta.

    Computed in at least fp32 whatever the activation dtype: sin of large arguments loses all precision
    in bf16, and at fp32 this is exactly the reference formula.
    """

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.alpha = nn.Parameter(torch.zeros(channels))
        self.beta = nn.Parameter(torch.zeros(channels))

    def forward(self, x: torch.Tensor, ctx: StreamContext | None = None) -> torch.Tensor:
        wide = torch.promote_types(x.dtype, torch.float32)
        alpha = self.alpha.to(wide).exp()[None, :, None]
        beta = self.beta.to(wide).exp()[None, :, None]
        xw = x.to(wide)
        y = xw + (1.0 / (beta + 1e-9)) * torch.sin(xw * alpha).pow(2)
        return y.to(x.dtype)


class ConvNeXtBlock(nn.Module):
    """Causal depthwise conv k7, LayerNorm, 4x pointwise MLP with GELU, learned per-channel gain."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dwconv = CausalConv1d(dim, dim, 7, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pwconv1 = nn.Linear(dim, 4 * dim)
        self.pwconv2 = nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(torch.full((dim,), 1e-6))

    def forward(self, x: torch.Tensor, ctx: StreamContext | None = None) -> torch.Tensor:
        h = self.dwconv(x, ctx).transpose(1, 2)
        h = self.pwconv2(F.gelu(self.pwconv1(self.norm(h))))
        return x + (self.gamma * h).transpose(1, 2)


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
        for unit in self.block:
            x = unit(x, ctx)
        return x


class LayerScale(nn.Module):
    def __init__(self, dim: int, init: float) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.full((dim,), init))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.scale * x


class WindowAttention(nn.Module):
    """Causal sliding-window attention with RoPE; a query sees itself and the ``window - 1`` frames before.

    That is the reference mask ``q - window < k <= q`` (transformers' sliding-window overlay), so a stream
    needs the last ``window - 1`` keys/values of each layer, stored after RoPE at their absolute positions.
    """

    def __init__(self, cfg: Qwen3DecoderConfig) -> None:
        super().__init__()
        self.heads = cfg.num_attention_heads
        self.kv_heads = cfg.num_key_value_heads
        self.head_dim = cfg.head_dim
        self.kv_history = cfg.sliding_window - 1
        bias = cfg.attention_bias
        self.q_proj = nn.Linear(cfg.hidden_size, self.heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(cfg.hidden_size, self.kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(cfg.hidden_size, self.kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.heads * self.head_dim, cfg.hidden_size, bias=bias)
        self.state_key = ""

    def state_shapes(self) -> dict[str, tuple[int, ...]]:
        shape = (self.kv_heads, self.kv_history, self.head_dim)
        return {f"{self.state_key}.k": shape, f"{self.state_key}.v": shape}

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        mask: torch.Tensor,
        ctx: StreamContext | None = None,
    ) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        q = apply_rope(q, cos, sin)
        k = apply_rope(k, cos, sin)
        if ctx is not None and self.kv_history:
            k = torch.cat([ctx.history(f"{self.state_key}.k"), k], dim=2)
            v = torch.cat([ctx.history(f"{self.state_key}.v"), v], dim=2)
            ctx.keep_tail(f"{self.state_key}.k", k, self.kv_history, dim=2)
            ctx.keep_tail(f"{self.state_key}.v", v, self.kv_history, dim=2)
        if self.kv_heads != self.heads:
            k = k.repeat_interleave(self.heads // self.kv_heads, dim=1)
            v = v.repeat_interleave(self.heads // self.kv_heads, dim=1)
        # Explicit scores -> fp32 softmax -> weighted sum, in the reference's (eager) order: with at most
        # T x (window - 1 + T) scores per head this costs nothing next to the convs, and it keeps fp32
        # results bit-identical to the reference instead of differing by a fused kernel's rounding.
        scores = torch.matmul(q, k.transpose(2, 3)) * self.head_dim**-0.5
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
        probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
        out = torch.matmul(probs, v)
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


def window_mask(q_pos: torch.Tensor, k_pos: torch.Tensor, window: int) -> torch.Tensor:
    """Boolean ``[B, 1, Tq, Tk]`` mask: key visible iff ``q - window < k <= q`` and ``k >= 0``.

    ``k >= 0`` hides the zero-filled history of a fresh stream, which the offline pass never sees.
    """
    q = q_pos[:, None, :, None]
    k = k_pos[:, None, None, :]
    return (k <= q) & (k > q - window) & (k >= 0)
