"""The PersonaPlex LM: token embeddings, the Helium temporal transformer over a ring KV pool, the depformer.

Module and parameter names are the checkpoint's fused moshi names (``transformer.layers.N.self_attn.
in_proj_weight``, ``depformer.layers.N.gating.K.linear_in.weight``, ...), so a released ``model.safetensors``
loads strictly without renaming. The depformer stores one weight set per inner step stacked in one tensor
(as the checkpoint does) and a step slices its rows: views, no copies.

Everything here is batched over slots and free of host syncs and value-dependent branches, so the frame
step built on it (``frame.py``) can be captured as one CUDA graph per (batch, context) bucket.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from .config import ZERO_TOKEN, LMConfig
from .layers import Gating, RMSNorm, apply_rope, gated, rope_tables


@dataclass
class RingKV:
    """K/V of every slot: ``[layers, slots, heads, window, head_dim]``. Position p of a slot lives at ring
    index ``p % window``; once the ring wraps, the oldest entry is overwritten (the window slides)."""

    k: torch.Tensor
    v: torch.Tensor

    @property
    def window(self) -> int:
        return self.k.shape[3]

    @staticmethod
    def bytes_per_position(config: LMConfig, dtype: torch.dtype) -> int:
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

    def qkv(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``x [B, T, D]`` -> q, k, v ``[B, H, T, hd]`` with RoPE applied to q and k."""
        h = F.linear(self.norm1(x), self.self_attn.in_proj_weight)
        q, k, v = h.unflatten(-1, (3, self.self_attn.num_heads, -1)).unbind(2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)

    def finish(self, x: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        """Residual + output projection of ``attn [B, H, T, hd]``, then the gated FFN block."""
        x = x + self.self_attn.out_proj(attn.transpose(1, 2).flatten(2))
        return x + self.gating(self.norm2(x))


class Temporal(nn.Module):
    """Helium: causal, RoPE at absolute positions, attention over the last ``context`` positions."""

    def __init__(self, config: LMConfig) -> None:
        super().__init__()
        self.config = config
        self.layers = nn.ModuleList([TemporalLayer(config) for _ in range(config.num_layers)])

    def decode(self, x: torch.Tensor, positions: torch.Tensor, kv: RingKV, attn_len: int) -> torch.Tensor:
        """One position per row: ``x [B, D]`` at ``positions [B]`` for slots ``[0, B)``; K/V written at each
        row's ring index; attention over ring entries ``[0, attn_len)`` that hold positions (``attn_len`` a
        static bucket >= every row's ``min(position + 1, window)``)."""
        b = x.shape[0]
        cos, sin = rope_tables(positions.unsqueeze(1), self.config.head_dim, self.config.max_period)
        rows = torch.arange(b, device=x.device)
        index = positions % kv.window
        filled = torch.clamp(positions + 1, max=kv.window)
        keys = torch.arange(attn_len, device=x.device)
        mask = (keys.unsqueeze(0) < filled.unsqueeze(1))[:, None, None, :]
        h = x.unsqueeze(1)
        for i, layer in enumerate(self.layers):
            q, k, v = layer.qkv(h, cos, sin)
            kv.k[i][rows, :, index] = k[:, :, 0]
            kv.v[i][rows, :, index] = v[:, :, 0]
            attn = F.scaled_dot_product_attention(
                q, kv.k[i, :b, :, :attn_len], kv.v[i, :b, :, :attn_len], attn_mask=mask
            )
            h = layer.finish(h, attn)
        return h[:, 0]

    def prefill(self, x: torch.Tensor, slot: int, start: int, kv: RingKV) -> None:
        """Write K/V of positions ``[start, start + T)`` of ``slot`` from inputs ``x [T, D]`` (the prompt
        never wraps the ring: ``start + T <= window``). Only the cache matters: prompt outputs are forced."""
        t = x.shape[0]
        end = start + t
        if end > kv.window:
            raise ValueError(
                f"prefill of positions [{start}, {end}) does not fit the {kv.window}-position window"
            )
        positions = torch.arange(start, end, device=x.device)
        cos, sin = rope_tables(positions.unsqueeze(0), self.config.head_dim, self.config.max_period)
        keys = torch.arange(end, device=x.device)
        mask = (keys.unsqueeze(0) <= positions.unsqueeze(1))[None, None]
        h = x.unsqueeze(0)
        last = len(self.layers) - 1
        for i, layer in enumerate(self.layers):
            q, k, v = layer.qkv(h, cos, sin)
            kv.k[i, slot, :, start:end] = k[0]
            kv.v[i, slot, :, start:end] = v[0]
            if i == last:
                break  # the last layer's output feeds nothing
            attn = F.scaled_dot_product_attention(
                q, kv.k[i, slot : slot + 1, :, :end], kv.v[i, slot : slot + 1, :, :end], attn_mask=mask
            )
            h = layer.finish(h, attn)


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

    def step(self, x: torch.Tensor, k: int, cache_k: torch.Tensor, cache_v: torch.Tensor) -> torch.Tensor:
        """Inner step ``k`` for ``x [B, d]``; ``cache_k/v [layers, >=B, heads, steps, hd]`` hold this frame's
        earlier steps (slots ``[0, k)``), and step k's own K/V is written at index k."""
        b, d = x.shape
        h = x.unsqueeze(1)
        for i, layer in enumerate(self.layers):
            w_in = layer.self_attn.in_proj_weight.view(-1, 3 * d, d)[k]
            qkv = F.linear(layer.norm1(h), w_in)
            q, kk, v = qkv.unflatten(-1, (3, layer.self_attn.num_heads, -1)).unbind(2)
            cache_k[i, :b, :, k] = kk[:, 0]
            cache_v[i, :b, :, k] = v[:, 0]
            attn = F.scaled_dot_product_attention(
                q.transpose(1, 2), cache_k[i, :b, :, : k + 1], cache_v[i, :b, :, : k + 1]
            )
            w_out = layer.self_attn.out_proj.weight.view(-1, d, d)[k]
            h = h + F.linear(attn.transpose(1, 2).flatten(2), w_out)
            g = layer.gating[k]
            h = h + gated(layer.norm2(h), g.linear_in.weight, g.linear_out.weight)
        return h[:, 0]


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
