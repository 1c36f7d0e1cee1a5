"""Qwen3 decoder stack over a caller-owned, static KV cache.

The engine owns one KV pool for all slots (``KVCache``: ``[layers, slots, kv_heads, max_len, head_dim]``)
and passes, per call, which slot each batch row belongs to and the absolute position of every token. The
same call shape covers chunked prefill (one row, ``T`` tokens from position ``p``) and batched decode
(``B`` rows, one token each, different lengths). New K/V are scattered into the pool first; attention then
reads the rows' slots with an explicit ``key_pos <= query_pos`` mask, so every shape is static and nothing
syncs with the host (CUDA-graph capturable). Stale entries beyond a slot's length are masked, which is why
a slot is "reset" just by restarting its positions at 0.

Rotary embedding: the talker config carries interleaved MRoPE (sections [24, 20, 20]). For text-only input
the reference builds its position ids as three identical copies (``get_rope_index`` expands one cumsum to 3
axes), and ``apply_multimodal_rotary_pos_emb(..., interleaved=True)`` only picks, per frequency, which axis's
cos/sin to use; with identical axes every pick equals axis 0, so MRoPE reduces exactly to 1-D RoPE with the
same ``inv_freq``. That is what this module implements (checked against qwen-tts 0.1.1 source).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from voxstage.nn.layers import FusedLinears, RMSNorm, SwiGLU, apply_rope, rope_cos_sin, rope_inv_freq

from .config import BackboneConfig


@dataclass
class KVCache:
    """Static K/V pool: ``k``/``v`` are ``[num_layers, num_slots, kv_heads, max_len, head_dim]``."""

    k: torch.Tensor
    v: torch.Tensor

    @classmethod
    def allocate(
        cls,
        cfg: BackboneConfig,
        num_slots: int,
        max_len: int,
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
    ) -> KVCache:
        if num_slots <= 0 or max_len <= 0:
            raise ValueError(f"KV cache needs num_slots > 0 and max_len > 0, got {num_slots}, {max_len}")
        shape = (cfg.num_layers, num_slots, cfg.num_kv_heads, max_len, cfg.head_dim)
        return cls(
            torch.zeros(shape, device=device, dtype=dtype), torch.zeros(shape, device=device, dtype=dtype)
        )

    @property
    def num_slots(self) -> int:
        return self.k.shape[1]

    @property
    def max_len(self) -> int:
        return self.k.shape[3]

    @staticmethod
    def bytes_per_token(cfg: BackboneConfig, dtype: torch.dtype) -> int:
        """K+V bytes one token occupies across all layers (for memory-budget admission)."""
        return (
            2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * torch.empty((), dtype=dtype).element_size()
        )


class Qwen3Attention(nn.Module):
    """GQA attention with per-head q/k RMSNorm and rotate-half RoPE; no biases."""

    def __init__(self, cfg: BackboneConfig) -> None:
        super().__init__()
        self.num_heads = cfg.num_heads
        self.num_kv_heads = cfg.num_kv_heads
        self.head_dim = cfg.head_dim
        self.q_proj = nn.Linear(cfg.hidden_size, cfg.num_heads * cfg.head_dim, bias=False)
        self.k_proj = nn.Linear(cfg.hidden_size, cfg.num_kv_heads * cfg.head_dim, bias=False)
        self.v_proj = nn.Linear(cfg.hidden_size, cfg.num_kv_heads * cfg.head_dim, bias=False)
        self.o_proj = nn.Linear(cfg.num_heads * cfg.head_dim, cfg.hidden_size, bias=False)
        self.q_norm = RMSNorm(cfg.head_dim, eps=cfg.rms_norm_eps)
        self.k_norm = RMSNorm(cfg.head_dim, eps=cfg.rms_norm_eps)
        self._qkv = FusedLinears(self.q_proj, self.k_proj, self.v_proj)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        k_pool: torch.Tensor,
        v_pool: torch.Tensor,
        write_index: tuple[torch.Tensor, torch.Tensor],
        slot_ids: torch.Tensor | None,
        attn_len: int,
        mask: torch.Tensor,
    ) -> torch.Tensor:
        b, t, _ = x.shape
        nh, nkv = self.num_heads, self.num_kv_heads
        fused = self._qkv.weight()
        if fused is None:
            q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        else:
            sizes = [nh * self.head_dim, nkv * self.head_dim, nkv * self.head_dim]
            q, k, v = nn.functional.linear(x, fused).split(sizes, dim=-1)
        q = self.q_norm(q.view(b, t, nh, self.head_dim))
        k = self.k_norm(k.view(b, t, nkv, self.head_dim))
        v = v.view(b, t, nkv, self.head_dim)
        # One rotary pass over q and k together (it is elementwise per head): half the kernels.
        q, k = apply_rope(torch.cat([q, k], dim=2), cos, sin).split([nh, nkv], dim=2)
        # (slot [B,1], :, pos [B,T]) addresses a [B, T, kv_heads, head_dim] block (an index_put, no sync).
        rows, cols = write_index
        k_pool[rows, :, cols] = k.to(k_pool.dtype)
        v_pool[rows, :, cols] = v.to(v_pool.dtype)
        if slot_ids is None:
            keys, values = k_pool[:b, :, :attn_len], v_pool[:b, :, :attn_len]
        else:
            keys, values = k_pool[slot_ids, :, :attn_len], v_pool[slot_ids, :, :attn_len]
        # GQA without repeating K/V: fold each KV head's query group into the query-length axis, so the
        # call is plain multi-head SDPA over kv_heads (any backend that takes a mask can run it).
        rep = self.num_heads // self.num_kv_heads
        qg = q.reshape(b, t, self.num_kv_heads, rep, self.head_dim).permute(0, 2, 3, 1, 4)
        qg = qg.reshape(b, self.num_kv_heads, rep * t, self.head_dim)
        out = F.scaled_dot_product_attention(qg, keys.to(q.dtype), values.to(q.dtype), attn_mask=mask)
        out = out.view(b, self.num_kv_heads, rep, t, self.head_dim).permute(0, 3, 1, 2, 4)
        return self.o_proj(out.reshape(b, t, self.num_heads * self.head_dim))


class Qwen3DecoderLayer(nn.Module):
    def __init__(self, cfg: BackboneConfig) -> None:
        super().__init__()
        self.self_attn = Qwen3Attention(cfg)
        self.mlp = SwiGLU(cfg.hidden_size, cfg.intermediate_size)
        self.input_layernorm = RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        k_pool: torch.Tensor,
        v_pool: torch.Tensor,
        write_index: tuple[torch.Tensor, torch.Tensor],
        slot_ids: torch.Tensor | None,
        attn_len: int,
        mask: torch.Tensor,
    ) -> torch.Tensor:
        x = x + self.self_attn(
            self.input_layernorm(x), cos, sin, k_pool, v_pool, write_index, slot_ids, attn_len, mask
        )
        return x + self.mlp(self.post_attention_layernorm(x))


class Qwen3Backbone(nn.Module):
    """``layers`` + final ``norm`` (checkpoint ``layers.N.*``, ``norm.weight``); returns post-norm states."""

    def __init__(self, cfg: BackboneConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.layers = nn.ModuleList(Qwen3DecoderLayer(cfg) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        # Not persistent: the checkpoint has no rotary buffers, and strict loading must not expect one.
        self.register_buffer("inv_freq", rope_inv_freq(cfg.head_dim, cfg.rope_theta), persistent=False)

    def forward(
        self,
        x: torch.Tensor,
        positions: torch.Tensor,
        cache: KVCache,
        slot_ids: torch.Tensor | None = None,
        attn_len: int | None = None,
    ) -> torch.Tensor:
        """Run ``x [B, T, H]`` at absolute ``positions [B, T]`` against ``cache``.

        ``slot_ids [B]`` names each row's cache slot; ``None`` means rows ``0..B-1`` (the code predictor's
        frame-local scratch cache; reading it is then a view rather than a gather). ``attn_len`` (a Python
        int, fixed per captured graph) bounds how many cache positions are read; it must exceed every
        position in the call and defaults to the whole cache. The caller guarantees positions lie in
        ``[0, attn_len)`` and that padding rows of a bucket point at a scratch slot.
        """
        if x.dim() != 3 or positions.shape != x.shape[:2]:
            raise ValueError(
                f"x must be [B, T, H], positions [B, T]; got {tuple(x.shape)}, {tuple(positions.shape)}"
            )
        b = x.shape[0]
        attn_len = cache.max_len if attn_len is None else attn_len
        if not 0 < attn_len <= cache.max_len:
            raise ValueError(f"attn_len must be in (0, {cache.max_len}], got {attn_len}")
        rows = torch.arange(b, device=x.device) if slot_ids is None else slot_ids
        write_index = (rows.unsqueeze(1), positions)
        cos, sin = rope_cos_sin(positions, self.inv_freq, x.dtype)
        cos, sin = cos.unsqueeze(2), sin.unsqueeze(2)  # broadcast over heads: [B, T, 1, head_dim]
        key_pos = torch.arange(attn_len, device=x.device)
        mask = key_pos.view(1, 1, attn_len) <= positions.unsqueeze(-1)  # [B, T, attn_len]
        # In the grouped-query layout the attention call uses (see Qwen3Attention), built once for all layers.
        rep = self.cfg.num_heads // self.cfg.num_kv_heads
        mask = mask.unsqueeze(1).expand(b, rep, *mask.shape[1:]).reshape(b, 1, rep * mask.shape[1], attn_len)
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, cache.k[i], cache.v[i], write_index, slot_ids, attn_len, mask)
        return self.norm(x)
