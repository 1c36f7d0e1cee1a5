"""Causal building blocks that the text-to-speech codecs (Qwen3-TTS 12 Hz, Audio8) share, each runnable
offline or as one exact streaming step.

Every block takes an optional :class:`StreamContext`. Without one it behaves like the references (causal
zero left padding, positions from 0). With one, the left padding is replaced by the stream's saved history
and the new history is filed, taken at each row's *real* end, so a batch can carry right-padded rows (fewer
new frames than the bucket's T) without corrupting their state. Everything is shape-static in (B, T).

Checkpoint names are the references' (``X.conv.weight`` for every conv; ConvNeXt's ``dwconv``/``norm``/
``pwconv1``/``pwconv2``/``gamma``), so both families load these modules strictly. The duplex codec (Mimi)
streams through an in-place context of its own in its family folder and does not use these.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from voxstage.nn import fused
from voxstage.nn.layers import RMSNorm

# ``scaled_dot_product_attention(enable_gqa=True)`` (grouped K/V heads without copies) arrived in torch 2.5.
_SDPA_GQA = tuple(int(p) for p in torch.__version__.split(".")[:2]) >= (2, 5)


_STEPS: dict[tuple[int, str], torch.Tensor] = {}


def _steps(size: int, device: torch.device) -> torch.Tensor:
    """``arange(size)`` on ``device``, kept between decode calls. One first made inside a graph capture would
    hold values only once that graph replays: it is not kept (the capture's warm-up runs make it first)."""
    key = (size, str(device))
    steps = _STEPS.get(key)
    if steps is None:
        capturing = device.type == "cuda" and torch.cuda.is_current_stream_capturing()
        with torch.inference_mode(False):  # a plain tensor: usable in and out of inference mode
            steps = torch.arange(size, device=device)
        if not capturing:
            _STEPS[key] = steps
    return steps


class StreamContext:
    """Histories in and out of one streaming step of B rows.

    ``state_in`` maps a state key to its ``[B, ...]`` history; blocks put their new history in ``state_out``.
    ``frames`` is the bucket's T (a Python int), so a block derives its time scale (steps per frame at its
    rate) from static shapes. ``lengths`` [B] counts each row's real frames; ``None`` means all T are real,
    which takes every new history as a static slice instead of a per-row gather.
    """

    def __init__(self, state_in: dict[str, torch.Tensor], lengths: torch.Tensor | None, frames: int) -> None:
        self.state_in = state_in
        self.state_out: dict[str, torch.Tensor] = {}
        self.lengths = lengths
        self.frames = frames
        self._index: dict[tuple[int, int, str], torch.Tensor] = {}  # shared by blocks of one rate

    def history(self, key: str) -> torch.Tensor:
        try:
            return self.state_in[key]
        except KeyError as exc:
            raise KeyError(f"streaming state has no entry {key!r}") from exc

    def keep_tail(self, key: str, joined: torch.Tensor, size: int, dim: int) -> None:
        """File the ``size`` steps of ``joined`` (history ++ new, along ``dim``) ending at each row's real
        end: with ``lengths[b]`` real frames at ``scale`` steps per frame that is
        ``joined[b, ..., lengths[b]*scale : lengths[b]*scale + size]``. A row with 0 real frames gets its
        old history back unchanged. A gather rather than a slice per row keeps the step free of host syncs
        (graph capture)."""
        if self.lengths is None:
            self.state_out[key] = joined.narrow(dim, joined.shape[dim] - size, size)
            return
        scale = (joined.shape[dim] - size) // self.frames
        cache_key = (scale, size, str(joined.device))
        index = self._index.get(cache_key)
        if index is None:
            # One launch per state size and rate, not three (the steps are kept between calls): the same ints.
            index = torch.add(_steps(size, joined.device), self.lengths[:, None], alpha=scale)
            self._index[cache_key] = index
        view = [1] * joined.dim()
        view[0], view[dim] = joined.shape[0], size
        shape = list(joined.shape)
        shape[dim] = size
        self.state_out[key] = torch.gather(joined, dim, index.view(view).expand(shape))


class CausalConv1d(nn.Module):
    """Conv with ``(k-1)*d + 1 - stride`` zeros of left padding, plus right padding that completes the last
    window, so T inputs give ``ceil(T / stride)`` outputs and none sees the future (for stride 1 the right
    padding is always zero and the output length equals the input length).

    Stride 1 (every decode-side conv) is streamable: its history is the last ``(k-1)*d`` inputs.
    """

    def __init__(
        self, cin: int, cout: int, kernel: int, *, stride: int = 1, dilation: int = 1, groups: int = 1
    ) -> None:
        super().__init__()
        self.conv = nn.Conv1d(cin, cout, kernel, stride=stride, dilation=dilation, groups=groups)
        self.stride = stride
        self.span = (kernel - 1) * dilation + 1
        self.left = self.span - stride
        self.history = self.left if stride == 1 else 0
        self.state_key = ""

    def state_shapes(self) -> dict[str, tuple[int, ...]]:
        return {self.state_key: (self.conv.in_channels, self.history)} if self.history else {}

    def forward(self, x: torch.Tensor, ctx: StreamContext | None = None) -> torch.Tensor:
        if ctx is not None and self.stride == 1 and self.history:
            joined = torch.cat([ctx.history(self.state_key), x], dim=-1)
            ctx.keep_tail(self.state_key, joined, self.history, dim=joined.dim() - 1)
            return self.conv(joined)
        if ctx is not None and self.stride != 1:
            raise RuntimeError("strided convs belong to the encoder, which does not stream")
        length = x.shape[-1]
        right = -(-length // self.stride) * self.stride - length
        if self.left or right:
            x = F.pad(x, (self.left, right))
        return self.conv(x)


class CausalConvTranspose1d(nn.Module):
    """ConvTranspose1d(k, s) with the last ``k - s`` outputs cropped: n inputs give exactly ``n * s``.

    Streaming keeps the last ``ceil(k/s) - 1`` *inputs* (not the overlapping outputs): re-running the
    transposed conv over them reproduces the overlap-add of the previous chunk's tail with the same arithmetic
    as offline, bias added once. A k == s upsampler needs no history at all.
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
        if ctx is None or self.history == 0:
            return self.conv(x)[..., : n * self.stride]
        joined = torch.cat([ctx.history(self.state_key), x], dim=-1)
        ctx.keep_tail(self.state_key, joined, self.history, dim=joined.dim() - 1)
        start = self.history * self.stride
        return self.conv(joined)[..., start : start + n * self.stride]


class ConvNeXtBlock(nn.Module):
    """Causal depthwise conv (k7), LayerNorm(1e-6), 4x pointwise MLP with exact GELU, per-channel gain."""

    def __init__(self, dim: int, kernel: int = 7) -> None:
        super().__init__()
        self.dwconv = CausalConv1d(dim, dim, kernel, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pwconv1 = nn.Linear(dim, 4 * dim)
        self.pwconv2 = nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(torch.full((dim,), 1e-6))

    def forward(self, x: torch.Tensor, ctx: StreamContext | None = None) -> torch.Tensor:
        h = self.dwconv(x, ctx).transpose(1, 2)
        h = self.pwconv2(F.gelu(self.pwconv1(self.norm(h))))
        return x + (self.gamma * h).transpose(1, 2)


def run_blocks(blocks: nn.ModuleList, x: torch.Tensor, ctx: StreamContext | None) -> torch.Tensor:
    """Run ``blocks`` in order, each with the same stream context."""
    for block in blocks:
        x = block(x, ctx)
    return x


def window_mask(q_pos: torch.Tensor, k_pos: torch.Tensor, window: int, head_dims: int = 1) -> torch.Tensor:
    """Boolean ``[B|1, *(1,) * head_dims, Tq, Tk]``: key visible iff ``q - window < k <= q`` and ``k >= 0``
    (``q_pos`` ``[B|1, Tq]``, ``k_pos`` ``[B|1, Tk]``). The size-1 head dims broadcast over the attention's
    head layout. ``k >= 0`` hides the zero-filled history of a fresh stream, which offline never sees."""
    q = q_pos[:, :, None]
    k = k_pos[:, None, :]
    visible = (k <= q) & (k > q - window) & (k >= 0)
    return visible.view(visible.shape[0], *(1,) * head_dims, *visible.shape[1:])


class WindowKVAttention(nn.Module):
    """What the codecs' sliding-window attentions share, apart from their projections and RoPE.

    A query at p sees keys in ``(p - window, p]``, so a stream keeps the last ``window - 1`` keys and values
    of each layer, stored after RoPE at their absolute positions (``<state_key>.k`` / ``.v``). Scores are at
    most T x (window - 1 + T) per head, so on the CPU the explicit scores -> fp32 softmax -> weighted sum form
    costs nothing next to the convs, and it keeps fp32 results bit-identical to the references' eager
    attention instead of differing by a fused kernel's rounding. On CUDA, where a small decode is
    launch-bound, :meth:`attend_heads` takes SDPA instead.
    """

    def __init__(self, heads: int, kv_heads: int, head_dim: int, window: int) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.kv_history = window - 1
        self.state_key = ""

    def state_shapes(self) -> dict[str, tuple[int, ...]]:
        shape = (self.kv_heads, self.kv_history, self.head_dim)
        return {f"{self.state_key}.k": shape, f"{self.state_key}.v": shape}

    def with_history(
        self, k: torch.Tensor, v: torch.Tensor, ctx: StreamContext | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Prepend the stream's saved keys/values to ``k``/``v`` ``[B, KV, T, D]`` and file the new tails
        (offline: returned unchanged)."""
        if ctx is None or not self.kv_history:
            return k, v
        k = torch.cat([ctx.history(f"{self.state_key}.k"), k], dim=2)
        v = torch.cat([ctx.history(f"{self.state_key}.v"), v], dim=2)
        ctx.keep_tail(f"{self.state_key}.k", k, self.kv_history, dim=2)
        ctx.keep_tail(f"{self.state_key}.v", v, self.kv_history, dim=2)
        return k, v

    def attend_heads(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor
    ) -> torch.Tensor:
        """Attention of ``q [B, H, T, D]`` over ``k``/``v [B, KV, Tk, D]``, query head h reading kv head
        ``h // (H / KV)``, under a boolean ``mask`` broadcastable to ``[B, H, T, Tk]`` (True: visible).

        On the CPU this is :meth:`attend` on repeated K/V heads, bit for bit the references' eager attention
        (golden parity). On CUDA it is one ``scaled_dot_product_attention`` call instead of ~8 launches
        (two matmuls, scale, mask fill, softmax, cast, and the K/V repeats): its fused kernels also softmax in
        fp32, so results differ from eager only by summation order. Every query sees at least itself, so no
        row is fully masked (which SDPA would turn into NaN).
        """
        group = self.heads // self.kv_heads
        if q.is_cuda:
            if group > 1 and _SDPA_GQA:
                return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
            if group > 1:  # torch < 2.5 has no enable_gqa
                k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        if group > 1:
            k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        return self.attend(q, k, v, mask)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """``softmax(q k^T / sqrt(d), masked) v`` over the last two dims, the softmax in fp32."""
        scores = torch.matmul(q, k.transpose(-1, -2)) * self.head_dim**-0.5
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
        probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(v.dtype)
        return torch.matmul(probs, v)


@dataclass(frozen=True)
class PrenormParts:
    """One pre-norm transformer layer as ``prenorm_layers_fused`` runs it: ``x + attention_scale(attention(
    norm_in(x)))``, then ``+ ffn_scale(ffn(norm_post(·)))``."""

    norm_in: RMSNorm
    attention: Callable[[torch.Tensor], torch.Tensor]  # [B, T, D] -> [B, T, D]
    attention_scale: Callable[[torch.Tensor], torch.Tensor]
    norm_post: RMSNorm
    ffn: Callable[[torch.Tensor], torch.Tensor]  # rows [N, D] -> [N, D]
    ffn_scale: Callable[[torch.Tensor], torch.Tensor]


def prenorm_layers_fused(h: torch.Tensor, layers: Sequence[PrenormParts], final: RMSNorm) -> torch.Tensor:
    """``layers`` then ``final`` on ``h [B, T, D]`` with the Triton glue kernels (CUDA; the codecs' decoders
    run in fp32, where RMSNorm is six launches): each residual add, after its layer scale, fused with the
    norm after it, as in the talkers' stacks. It rounds where the kernels do, within an fp32 step of the
    module path."""
    b, t, d = h.shape
    following = [layer.norm_in for layer in layers[1:]] + [final]
    first = layers[0].norm_in
    s, n = fused.add_rmsnorm(h.reshape(b * t, d).contiguous(), None, first.weight, first.eps)
    for layer, nxt in zip(layers, following, strict=True):
        a = layer.attention(n.view(b, t, d)).reshape(b * t, d)
        s, n = fused.add_rmsnorm(s, layer.attention_scale(a), layer.norm_post.weight, layer.norm_post.eps)
        s, n = fused.add_rmsnorm(s, layer.ffn_scale(layer.ffn(n)), nxt.weight, nxt.eps)
    return n.view(b, t, d)
