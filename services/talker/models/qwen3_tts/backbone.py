"""Qwen3 decoder stack over a caller-owned, static KV cache.

The pool, its call shape (slot per row, absolute positions, ``attn_len``), the causal mask and the cached
GQA attention are the talker-wide ones of ``voxstage.talker.kv``; this module adds Qwen3's projections,
per-head q/k RMSNorm and its rotary embedding.

Rotary embedding: the talker config carries interleaved MRoPE (sections [24, 20, 20]). For text-only input
the reference builds its position ids as three identical copies (``get_rope_index`` expands one cumsum to 3
axes), and ``apply_multimodal_rotary_pos_emb(..., interleaved=True)`` only picks, per frequency, which axis's
cos/sin to use; with identical axes every pick equals axis 0, so MRoPE reduces exactly to 1-D RoPE with the
same ``inv_freq``. That is what this module implements (checked against qwen-tts 0.1.1 source).
"""

from __future__ import annotations

import torch
from torch import nn

from voxstage.nn.layers import FusedLinears, RMSNorm, SwiGLU, apply_rope, rope_cos_sin, rope_inv_freq
from voxstage.talker.kv import (
    KVPool,
    attend,
    check_call,
    grouped_causal_mask,
    kv_bytes_per_token,
)
from voxstage.talker.kv import write_index as pool_write_index  # the layers' ``write_index`` is its result

from .config import BackboneConfig


class KVCache(KVPool):
    """The shared static pool, sized from a ``BackboneConfig``."""

    @classmethod
    def allocate(
        cls,
        cfg: BackboneConfig,
        num_slots: int,
        max_len: int,
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
    ) -> KVCache:
        return cls.zeros(cfg.num_layers, num_slots, cfg.num_kv_heads, max_len, cfg.head_dim, device, dtype)

    @staticmethod
    def bytes_per_token(cfg: BackboneConfig, dtype: torch.dtype) -> int:
        """K+V bytes one token occupies across all layers (for memory-budget admission)."""
        return kv_bytes_per_token(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, dtype)


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
        out = attend(q, k, v, k_pool, v_pool, write_index, slot_ids, attn_len, mask)
        return self.o_proj(out)


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
        attn_len = cache.max_len if attn_len is None else attn_len
        check_call(x, positions, attn_len, cache)
        write = pool_write_index(positions, slot_ids)
        cos, sin = rope_cos_sin(positions, self.inv_freq, x.dtype)
        cos, sin = cos.unsqueeze(2), sin.unsqueeze(2)  # broadcast over heads: [B, T, 1, head_dim]
        mask = grouped_causal_mask(positions, attn_len, self.cfg.num_heads // self.cfg.num_kv_heads)
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, cache.k[i], cache.v[i], write, slot_ids, attn_len, mask)
        return self.norm(x)
