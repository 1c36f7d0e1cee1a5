"""The PersonaPlex LM: token embeddings, the Helium temporal transformer over a ring KV pool, the depformer.

Module and parameter names are the checkpoint's fused moshi names (``transformer.layers.N.self_attn.
in_proj_weight``, ``depformer.layers.N.gating.K.linear_in.weight``, ...), so a released ``model.safetensors``
loads strictly without renaming. The depformer stores one weight set per inner step stacked in one tensor
(as the checkpoint does) and a step slices its rows: views, no copies.

Everything here is batched over slots and free of host syncs and value-dependent branches, so the frame
step built on it (``frame.py``) can be captured as one CUDA graph per (batch, context) bucket.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from services.talker.kv import attend_pool
from voxstage.nn import kv_fp8
from voxstage.nn.fused import add_rmsnorm, qkv_into_cache, rope_rotate, silu_mul

from .config import ZERO_TOKEN, LMConfig
from .layers import Gating, RMSNorm, rope_tables


@dataclass
class RingKV:
    """K/V of every slot: ``[layers, slots, heads, window, head_dim]``. Position p of a slot lives at ring
    index ``p % window``; once the ring wraps, the oldest entry is overwritten (the window slides).

    An fp8 ring (``kv_cache_dtype: fp8``) stores e4m3 with static scales ``k_scale``/``v_scale [layers,
    heads]`` (``voxstage.nn.kv_fp8``); being the same for every slot and position, they make slot moves and
    the ring's overwrites plain byte copies."""

    k: torch.Tensor
    v: torch.Tensor
    k_scale: torch.Tensor | None = None
    v_scale: torch.Tensor | None = None

    @property
    def window(self) -> int:
        return self.k.shape[3]

    def layer_scales(self, layer: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        if self.k_scale is None or self.v_scale is None:
            return None
        return self.k_scale[layer], self.v_scale[layer]

    @staticmethod
    def bytes_per_position(config: LMConfig, dtype: torch.dtype) -> int:
        """K+V bytes of one position of one slot over all layers, ``dtype`` the ring's storage type."""
        return 2 * config.num_layers * config.dim * torch.empty((), dtype=dtype).element_size()


class TemporalAttention(nn.Module):
    def __init__(self, config: LMConfig) -> None:
        super().__init__()
        self.num_heads = config.num_heads
        self.in_proj_weight = nn.Parameter(torch.empty(3 * config.dim, config.dim))
        self.out_proj = nn.Linear(config.dim, config.dim, bias=False)


class TemporalLayer(nn.Module):
    def __init__(self, config: LMConfig) -> None:
        super().__init__()
        self.self_attn = TemporalAttention(config)
        self.norm1 = RMSNorm(config.dim)
        self.norm2 = RMSNorm(config.dim)
        self.gating = Gating(config.dim, config.hidden)


def _ffn(gating: Gating, x: torch.Tensor) -> torch.Tensor:
    return F.linear(silu_mul(F.linear(x, gating.linear_in.weight)), gating.linear_out.weight)


def _blocks(
    layers: Sequence[Any],
    x: torch.Tensor,
    out_norm: RMSNorm | None,
    attend: Callable[[int, Any, torch.Tensor], torch.Tensor | None],
) -> torch.Tensor:
    """Pre-norm residual blocks over token rows ``x [N, D]``: ``attend(i, layer, normed)`` gives the
    attention block's output rows (None: stop, only the caches mattered). Every residual add is fused with
    the RMSNorm after it, so the result is ``out_norm(stream)`` (or the raw stream without ``out_norm``)."""
    h, normed = add_rmsnorm(x, None, layers[0].norm1.alpha, layers[0].norm1.eps)
    last = len(layers) - 1
    for i, layer in enumerate(layers):
        attn = attend(i, layer, normed)
        if attn is None:
            return h
        h, normed = add_rmsnorm(h, attn, layer.norm2.alpha, layer.norm2.eps)
        ff = _ffn(layer.gating, normed)
        following = layers[i + 1].norm1 if i < last else out_norm
        if following is None:
            return h + ff
        h, normed = add_rmsnorm(h, ff, following.alpha, following.eps)
    return normed


class Temporal(nn.Module):
    """Helium: causal, RoPE at absolute positions, attention over the last ``context`` positions."""

    def __init__(self, config: LMConfig) -> None:
        super().__init__()
        self.config = config
        self.layers = nn.ModuleList([TemporalLayer(config) for _ in range(config.num_layers)])

    def decode(
        self, x: torch.Tensor, positions: torch.Tensor, kv: RingKV, attn_len: int, out_norm: RMSNorm
    ) -> torch.Tensor:
        """One position per row: ``x [B, D]`` at ``positions [B]`` for slots ``[0, B)``; K/V written at each
        row's ring index; attention over ring entries ``[0, attn_len)`` that hold positions (``attn_len`` a
        static bucket >= every row's ``min(position + 1, window)``). Returns ``out_norm`` of the output."""
        b = x.shape[0]
        c = self.config
        rope = rope_tables(positions, c.head_dim, c.max_period)
        index = positions % kv.window
        filled = torch.clamp(positions + 1, max=kv.window)
        mask = (torch.arange(attn_len, device=x.device).unsqueeze(0) < filled.unsqueeze(1))[:, None, None, :]

        # fp8: the talker's pool attention reads the ring by row (on CUDA the Triton kernel reads fp8 as
        # stored; elsewhere it dequantizes). Ring entries [0, filled) hold positions, a prefix, so the pool's
        # key <= query rule at "query" filled - 1 is this mask (which is also the pool's mask layout).
        last = (filled - 1).unsqueeze(1) if kv.k_scale is not None else filled

        def attend(i: int, layer: nn.Module, normed: torch.Tensor) -> torch.Tensor:
            qkv = F.linear(normed, layer.self_attn.in_proj_weight)
            scales = kv.layer_scales(i)
            q = qkv_into_cache(qkv, c.num_heads, kv.k[i], kv.v[i], index, rope, scales)
            if scales is not None:
                attn = attend_pool(q.unsqueeze(1), kv.k[i], kv.v[i], None, attn_len, mask, last, scales)
                return layer.self_attn.out_proj(attn.reshape(b, -1))
            keys, values = kv.k[i, :b, :, :attn_len], kv.v[i, :b, :, :attn_len]
            attn = F.scaled_dot_product_attention(q.unsqueeze(2), keys, values, attn_mask=mask)
            return layer.self_attn.out_proj(attn.reshape(b, -1))

        return _blocks(list(self.layers), x, out_norm, attend)

    def kv_fp8_scales(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Static fp8 scales ``(k_scale, v_scale) [layers, heads]`` from the weights alone
        (``voxstage.nn.kv_fp8``): K and V rows of ``in_proj`` over the RMS-normalised input scaled by
        ``norm1``; K's interleaved RoPE turns a pair into at most its length."""
        c = self.config
        k_scales, v_scales = [], []
        with torch.no_grad():
            for layer in self.layers:
                w = layer.self_attn.in_proj_weight
                alpha = layer.norm1.alpha.reshape(-1)
                k_bounds = kv_fp8.linear_bounds(w[c.dim : 2 * c.dim], alpha)
                k_bounds = kv_fp8.rope_pair_bounds(k_bounds.view(c.num_heads, -1), interleaved=True)
                k_scales.append(kv_fp8.head_scales(k_bounds, c.num_heads))
                v_scales.append(kv_fp8.head_scales(kv_fp8.linear_bounds(w[2 * c.dim :], alpha), c.num_heads))
        return torch.stack(k_scales), torch.stack(v_scales)

    def prefill(
        self,
        x: torch.Tensor,
        slots: Sequence[int] | int,
        start: int,
        kv: RingKV,
        index: torch.Tensor | None = None,
    ) -> None:
        """Write K/V of positions ``[start, start + T)`` of each of ``slots`` from inputs ``x [B * T, D]``
        (slot after slot; the prompt never wraps the ring: ``start + T <= window``). Only the cache matters:
        prompt outputs are forced. ``index``: ``slots`` as a device tensor, when the caller has it. With
        ``slots`` a count, ``index`` names them: no host value of a slot is read (a CUDA graph replays it
        for whichever slots the index holds then)."""
        b = slots if isinstance(slots, int) else len(slots)
        t = x.shape[0] // b
        end = start + t
        if end > kv.window or t * b != x.shape[0]:
            raise ValueError(
                f"prefill of {x.shape[0]} rows for {b} slots at [{start}, {end}) does not fit the "
                f"{kv.window}-position window"
            )
        c = self.config
        positions = torch.arange(start, end, device=x.device)
        cos, sin = rope_tables(positions.repeat(b), c.head_dim, c.max_period)
        mask = (torch.arange(end, device=x.device).unsqueeze(0) <= positions.unsqueeze(1))[None, None]
        # One slot is a plain slice of the ring; several are one gather/scatter over the slot dimension.
        rows: slice | torch.Tensor
        if isinstance(slots, int):
            assert index is not None, "a slot count needs the slots' index"
            rows = index
        elif b == 1:
            rows = slice(slots[0], slots[0] + 1)
        else:
            rows = index if index is not None else torch.as_tensor(list(slots), device=x.device)
        last = len(self.layers) - 1

        def attend(i: int, layer: nn.Module, normed: torch.Tensor) -> torch.Tensor | None:
            q, k, v = (
                F.linear(normed, layer.self_attn.in_proj_weight).unflatten(-1, (3, c.num_heads, -1)).unbind(1)
            )
            q, k = rope_rotate(q, cos, sin), rope_rotate(k, cos, sin)  # [B * T, H, hd]
            scales = kv.layer_scales(i)
            k_scale, v_scale = (None, None) if scales is None else (s.view(-1, 1, 1) for s in scales)
            k_ring, v_ring = kv.k[i], kv.v[i]  # [slots, H, window, hd]
            k, v = (m.unflatten(0, (b, t)).transpose(1, 2) for m in (k, v))  # [B, H, T, hd]
            k_ring[rows, :, start:end] = kv_fp8.store(k, kv.k.dtype, k_scale)
            v_ring[rows, :, start:end] = kv_fp8.store(v, kv.v.dtype, v_scale)
            if i == last:
                return None  # the last layer's output feeds nothing
            keys = kv_fp8.load(k_ring[rows, :, :end], q.dtype, k_scale)
            values = kv_fp8.load(v_ring[rows, :, :end], q.dtype, v_scale)
            with _prefill_attention(x.device):
                attn = F.scaled_dot_product_attention(
                    q.unflatten(0, (b, t)).transpose(1, 2), keys, values, attn_mask=mask
                )  # [B, H, T, hd]
            return layer.self_attn.out_proj(attn.transpose(1, 2).reshape(b * t, -1))

        _blocks(list(self.layers), x, None, attend)


def _prefill_attention(device: torch.device) -> contextlib.AbstractContextManager[None]:
    """Prefill chunks come in many shapes (prompt lengths, budget splits). On CUDA, PyTorch's default picks
    cuDNN attention, which builds an execution plan per new shape (hundreds of ms each: on the H200 a join
    burst stalled every live session's ticks); the memory-efficient kernel needs no plan."""
    if device.type != "cuda":
        return contextlib.nullcontext()
    return sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])


class DepformerAttention(nn.Module):
    def __init__(self, config: LMConfig) -> None:
        super().__init__()
        d, s = config.depformer_dim, config.steps
        self.num_heads = config.depformer_num_heads
        self.in_proj_weight = nn.Parameter(torch.empty(s * 3 * d, d))
        self.out_proj = nn.Linear(d, s * d, bias=False)


class DepformerLayer(nn.Module):
    def __init__(self, config: LMConfig) -> None:
        super().__init__()
        self.self_attn = DepformerAttention(config)
        self.norm1 = RMSNorm(config.depformer_dim)
        self.norm2 = RMSNorm(config.depformer_dim)
        hidden = config.depformer_hidden
        self.gating = nn.ModuleList([Gating(config.depformer_dim, hidden) for _ in range(config.steps)])


class Depformer(nn.Module):
    """The per-frame inner transformer: step k predicts agent codebook k from the temporal output and the
    previous token, attending causally over this frame's earlier steps (no positional embedding)."""

    def __init__(self, config: LMConfig) -> None:
        super().__init__()
        self.config = config
        self.layers = nn.ModuleList([DepformerLayer(config) for _ in range(config.depformer_num_layers)])

    def step(
        self, x: torch.Tensor, k: int, cache_k: torch.Tensor, cache_v: torch.Tensor, index: torch.Tensor
    ) -> torch.Tensor:
        """Inner step ``k`` for ``x [B, d]``; ``cache_k/v [layers, >=B, heads, steps, hd]`` hold this frame's
        earlier steps (slots ``[0, k)``), and step k's own K/V is written at ``index`` (k for every row)."""
        b, d = x.shape
        heads = self.config.depformer_num_heads

        def attend(i: int, layer: nn.Module, normed: torch.Tensor) -> torch.Tensor:
            qkv = F.linear(normed, layer.self_attn.in_proj_weight.view(-1, 3 * d, d)[k])
            q = qkv_into_cache(qkv, heads, cache_k[i], cache_v[i], index, None)
            attn = F.scaled_dot_product_attention(
                q.unsqueeze(2), cache_k[i, :b, :, : k + 1], cache_v[i, :b, :, : k + 1]
            )
            return F.linear(attn.reshape(b, -1), layer.self_attn.out_proj.weight.view(-1, d, d)[k])

        layers = [_StepView(layer, k) for layer in self.layers]
        return _blocks(layers, x, None, attend)


class _StepView:
    """A depformer layer seen at inner step k: its shared norms and step k's feed-forward."""

    def __init__(self, layer: DepformerLayer, k: int) -> None:
        self.self_attn = layer.self_attn
        self.norm1, self.norm2 = layer.norm1, layer.norm2
        self.gating = layer.gating[k]


class PersonaPlexLM(nn.Module):
    def __init__(self, config: LMConfig) -> None:
        super().__init__()
        self.config = config
        c = config
        self.emb = nn.ModuleList([nn.Embedding(c.card + 1, c.dim) for _ in range(c.n_q)])
        self.text_emb = nn.Embedding(c.text_card + 1, c.dim)
        self.text_linear = nn.Linear(c.dim, c.text_card, bias=False)
        self.transformer = Temporal(c)
        self.out_norm = RMSNorm(c.dim)
        self.depformer_in = nn.ModuleList(
            [nn.Linear(c.dim, c.depformer_dim, bias=False) for _ in range(c.steps)]
        )
        self.depformer_text_emb = nn.Embedding(c.text_card + 1, c.depformer_dim)
        self.depformer_emb = nn.ModuleList(
            [nn.Embedding(c.card + 1, c.depformer_dim) for _ in range(c.steps - 1)]
        )
        self.depformer = Depformer(c)
        self.linears = nn.ModuleList([nn.Linear(c.depformer_dim, c.card, bias=False) for _ in range(c.steps)])

    @property
    def device(self) -> torch.device:
        return self.text_linear.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.text_linear.weight.dtype

    def embed(self, columns: torch.Tensor) -> torch.Tensor:
        """Token columns ``[..., 17]`` (text, 16 audio codebooks) -> input embeddings ``[..., dim]``.

        The sum is the audio streams in order, then text (the reference's order, which fp32 parity needs);
        the zero token (-1) contributes exactly nothing."""
        out: torch.Tensor | None = None
        for k, table in enumerate(self.emb):
            e = _lookup(table, columns[..., 1 + k])
            out = e if out is None else out + e
        assert out is not None
        return out + _lookup(self.text_emb, columns[..., 0])

    def depformer_input(self, k: int, temporal_out: torch.Tensor, prev: torch.Tensor) -> torch.Tensor:
        """Step ``k``'s input: the projected temporal output plus the previous token's embedding (the text
        token for step 0, agent codebook k-1 after)."""
        table = self.depformer_text_emb if k == 0 else self.depformer_emb[k - 1]
        return self.depformer_in[k](temporal_out) + _lookup(table, prev)


def _lookup(table: nn.Embedding, ids: torch.Tensor) -> torch.Tensor:
    e = F.embedding(ids.clamp(min=0), table.weight)
    return torch.where((ids == ZERO_TOKEN).unsqueeze(-1), torch.zeros((), dtype=e.dtype, device=e.device), e)
