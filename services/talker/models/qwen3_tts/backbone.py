"""Qwen3 decoder stack over a caller-owned, static KV cache.

The pool, its call shape (slot per row, absolute positions, ``attn_len``), the causal mask and the cached
GQA attention are the talker-wide ones of ``services.talker.kv``; this module adds Qwen3's projections,
per-head q/k RMSNorm and its rotary embedding.

Rotary embedding: the talker config carries interleaved MRoPE (sections [24, 20, 20]). For text-only input
the reference builds its position ids as three identical copies (``get_rope_index`` expands one cumsum to 3
axes), and ``apply_multimodal_rotary_pos_emb(..., interleaved=True)`` only picks, per frequency, which axis's
cos/sin to use; with identical axes every pick equals axis 0, so MRoPE reduces exactly to 1-D RoPE with the
same ``inv_freq``. That is what this module implements (checked against qwen-tts 0.1.1 source).

On CUDA with the Triton kernels of ``voxstage.nn.fused`` on, the stack runs a fused path with far fewer
launches per layer (the decode step is launch-bound: ~100 layer passes per frame): q/k norm + RoPE + the K/V
write in one kernel, SwiGLU's SiLU-product in one, and every residual add fused with the norm after it, so a
layer boundary is one kernel. It rounds where the kernels do (once per fused op), i.e. within a bf16 step of
the module path, which stays the path everywhere else (CPU golden parity is unchanged).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from services.talker.kv import (
    KVPool,
    Scales,
    attend,
    attend_pool,
    check_call,
    grouped_causal_mask,
    kv_bytes_per_token,
)
from services.talker.kv import write_index as pool_write_index  # the layers' ``write_index`` is its result
from voxstage.nn import fused, kv_fp8
from voxstage.nn.layers import FusedLinears, RMSNorm, SwiGLU, apply_rope, rope_cos_sin, rope_inv_freq

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
        scales: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> KVCache:
        """``dtype`` is the storage type: the model's, or fp8 with ``scales`` (``kv_fp8_scales``)."""
        return cls.zeros(
            cfg.num_layers, num_slots, cfg.num_kv_heads, max_len, cfg.head_dim, device, dtype, scales
        )

    @staticmethod
    def bytes_per_token(cfg: BackboneConfig, dtype: torch.dtype) -> int:
        """K+V bytes one token occupies across all layers (for memory-budget admission)."""
        return kv_bytes_per_token(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, dtype)


@dataclass(frozen=True)
class StackCall:
    """What every layer of one stack call shares: built once per call (``Qwen3Backbone.call_tables``), or
    once per shape for positions that never change (``Qwen3Backbone.fixed_call``)."""

    positions: torch.Tensor  # [B, T] int64
    cos: torch.Tensor  # [B, T, 1, head_dim] activation dtype, broadcast over heads
    sin: torch.Tensor
    mask: torch.Tensor  # grouped_causal_mask, [B, 1, group * T, attn_len]
    write: tuple[torch.Tensor, torch.Tensor]  # write_index: (slot [B, 1], position [B, T])
    token_slot: torch.Tensor  # [B * T]: the fused path's per-token form of ``write``
    token_pos: torch.Tensor  # [B * T]


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
        scales: Scales = None,
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
        out = attend(q, k, v, k_pool, v_pool, write_index, slot_ids, attn_len, mask, scales)
        return self.o_proj(out)

    def forward_fused(
        self,
        h: torch.Tensor,
        batch: int,
        k_pool: torch.Tensor,
        v_pool: torch.Tensor,
        call: StackCall,
        slot_ids: torch.Tensor | None,
        attn_len: int,
        scales: Scales = None,
    ) -> torch.Tensor:
        """The kernel path on normalised rows ``h [B*T, H]``; returns the output projection ``[B*T, H]``."""
        nh, nkv, hd = self.num_heads, self.num_kv_heads, self.head_dim
        n = h.shape[0]
        fused_w = self._qkv.weight()
        if fused_w is None:
            qkv = torch.cat([self.q_proj(h), self.k_proj(h), self.v_proj(h)], dim=-1)
        else:
            qkv = nn.functional.linear(h, fused_w)
        cos, sin = call.cos.reshape(n, hd), call.sin.reshape(n, hd)
        q = fused.qk_norm_rope_into_cache(
            qkv,
            nh,
            nkv,
            self.q_norm,
            self.k_norm,
            cos,
            sin,
            k_pool,
            v_pool,
            call.token_slot,
            call.token_pos,
            scales,
        )
        q = q.reshape(batch, n // batch, nh, hd)
        tokens = (call.token_slot, call.token_pos)  # a prefill's tokens as the kernel's rows (kv.token_rows)
        out = attend_pool(q, k_pool, v_pool, slot_ids, attn_len, call.mask, call.positions, scales, tokens)
        return self.o_proj(out.reshape(n, nh * hd))


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
        scales: Scales = None,
    ) -> torch.Tensor:
        x = x + self.self_attn(
            self.input_layernorm(x), cos, sin, k_pool, v_pool, write_index, slot_ids, attn_len, mask, scales
        )
        return x + self.mlp(self.post_attention_layernorm(x))

    def mlp_fused(self, h: torch.Tensor) -> torch.Tensor:
        """SwiGLU on rows ``h [N, H]`` with the SiLU-product as one kernel over the gate|up GEMM."""
        gate_up = self.mlp.gate_up_weight()
        if gate_up is None:  # the fused weight's views were replaced (e.g. ``.to()`` after construction)
            return self.mlp(h)
        return self.mlp.down_proj(fused.silu_mul(nn.functional.linear(h, gate_up)))


class Qwen3Backbone(nn.Module):
    """``layers`` + final ``norm`` (checkpoint ``layers.N.*``, ``norm.weight``); returns post-norm states."""

    def __init__(self, cfg: BackboneConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.layers = nn.ModuleList(Qwen3DecoderLayer(cfg) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        # Not persistent: the checkpoint has no rotary buffers, and strict loading must not expect one.
        self.register_buffer("inv_freq", rope_inv_freq(cfg.head_dim, cfg.rope_theta), persistent=False)
        self._fixed_calls: dict[tuple[int, int, int, int, torch.dtype, torch.device], StackCall] = {}

    def forward(
        self,
        x: torch.Tensor,
        positions: torch.Tensor,
        cache: KVCache,
        slot_ids: torch.Tensor | None = None,
        attn_len: int | None = None,
        call: StackCall | None = None,
    ) -> torch.Tensor:
        """Run ``x [B, T, H]`` at absolute ``positions [B, T]`` against ``cache``.

        ``slot_ids [B]`` names each row's cache slot; ``None`` means rows ``0..B-1`` (the code predictor's
        frame-local scratch cache; reading it is then a view rather than a gather). ``attn_len`` (a Python
        int, fixed per captured graph) bounds how many cache positions are read; it must exceed every
        position in the call and defaults to the whole cache. The caller guarantees positions lie in
        ``[0, attn_len)`` and that padding rows of a bucket point at a scratch slot. ``call``: the call's
        tables, if the caller has them already (``fixed_call``); built for these positions, slots and
        ``attn_len``.
        """
        attn_len = cache.max_len if attn_len is None else attn_len
        check_call(x, positions, attn_len, cache)
        if call is None:
            call = self.call_tables(positions, slot_ids, attn_len, x.dtype)
        elif call.mask.shape[-1] != attn_len or call.positions.shape != positions.shape:
            raise ValueError("call tables built for another shape or attn_len")
        if fused.kernels_active(x):
            return self._forward_fused(x, cache, call, slot_ids, attn_len)
        cos, sin, mask = call.cos, call.sin, call.mask
        for i, layer in enumerate(self.layers):
            scales = cache.layer_scales(i)
            x = layer(x, cos, sin, cache.k[i], cache.v[i], call.write, slot_ids, attn_len, mask, scales)
        return self.norm(x)

    def _forward_fused(
        self, x: torch.Tensor, cache: KVCache, call: StackCall, slot_ids: torch.Tensor | None, attn_len: int
    ) -> torch.Tensor:
        b, t, d = x.shape
        # Each layer boundary is one kernel: the residual add after a layer's MLP is fused with the next
        # layer's input norm (after the last layer, with the final norm).
        following = [layer.input_layernorm for layer in self.layers[1:]] + [self.norm]
        first = self.layers[0].input_layernorm
        s, h = fused.add_rmsnorm(x.reshape(b * t, d).contiguous(), None, first.weight, first.eps)
        for i, (layer, nxt) in enumerate(zip(self.layers, following, strict=True)):
            a = layer.self_attn.forward_fused(
                h, b, cache.k[i], cache.v[i], call, slot_ids, attn_len, cache.layer_scales(i)
            )
            post = layer.post_attention_layernorm
            s, h = fused.add_rmsnorm(s, a, post.weight, post.eps)
            s, h = fused.add_rmsnorm(s, layer.mlp_fused(h), nxt.weight, nxt.eps)
        return h.view(b, t, d)

    def kv_fp8_scales(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Static fp8 scales ``(k_scale, v_scale) [layers, kv_heads]`` from the weights alone
        (``voxstage.nn.kv_fp8``). K is the output of the per-head RMSNorm: an RMS-normalised head vector
        has elements of at most ``sqrt(hd)``, times the norm's weight, and RoPE turns a rotate-half pair
        into at most its length. V is ``v_proj`` of the RMS-normalised layer input."""
        cfg = self.cfg
        hd, nkv = cfg.head_dim, cfg.num_kv_heads
        k_scales, v_scales = [], []
        with torch.no_grad():
            for layer in self.layers:
                attn = layer.self_attn
                k_elem = attn.k_norm.weight.float().abs() * hd**0.5
                k_bounds = kv_fp8.rope_pair_bounds(k_elem, interleaved=False).repeat(nkv)
                k_scales.append(kv_fp8.head_scales(k_bounds, nkv))
                v_bounds = kv_fp8.linear_bounds(attn.v_proj.weight, layer.input_layernorm.weight)
                v_scales.append(kv_fp8.head_scales(v_bounds, nkv))
        return torch.stack(k_scales), torch.stack(v_scales)

    def call_tables(
        self, positions: torch.Tensor, slot_ids: torch.Tensor | None, attn_len: int, dtype: torch.dtype
    ) -> StackCall:
        """RoPE tables, causal mask and write index of one call, shared by all its layers."""
        b, t = positions.shape
        write = pool_write_index(positions, slot_ids)
        cos, sin = rope_cos_sin(positions, self.inv_freq, dtype)
        mask = grouped_causal_mask(positions, attn_len, self.cfg.num_heads // self.cfg.num_kv_heads)
        return StackCall(
            positions=positions,
            cos=cos.unsqueeze(2),
            sin=sin.unsqueeze(2),
            mask=mask,
            write=write,
            token_slot=write[0].expand(b, t).reshape(-1).contiguous(),  # the pool kernel reads unit stride
            token_pos=positions.reshape(-1),
        )

    def fixed_call(self, batch: int, start: int, length: int, attn_len: int, dtype: torch.dtype) -> StackCall:
        """The tables of a call at positions ``start .. start+length-1`` in rows ``0..batch-1`` of a scratch
        cache (``slot_ids`` None). The code predictor's positions are the same every frame, so these are
        built once per shape and reused (its 15 calls a frame would otherwise rebuild them, ~12 launches
        each). Built on first use, which is an eager run: graph capture is preceded by warm-up runs."""
        device = self.inv_freq.device
        key = (batch, start, length, attn_len, dtype, device)
        call = self._fixed_calls.get(key)
        if call is not None:
            return call
        # Plain tensors (not inference tensors) so a later call under autograd may use them too.
        with torch.inference_mode(False), torch.no_grad():
            positions = torch.arange(start, start + length, device=device).expand(batch, length).contiguous()
            call = self.call_tables(positions, None, attn_len, dtype)
        # Tables first built inside a graph capture would hold values only once that graph replays: never
        # share those (they are then part of that graph, as unfixed tables are).
        if device.type != "cuda" or not torch.cuda.is_current_stream_capturing():
            self._fixed_calls[key] = call
        return call
