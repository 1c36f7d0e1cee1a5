"""Static KV pool and cached GQA attention shared by the talker stacks that run over one (Qwen3 backbone,
Audio8 slow and fast AR).

The engine owns one pool for all slots (``[layers, slots, kv_heads, positions, head_dim]``) and passes, per
call, which slot each batch row belongs to and the absolute position of every token. The same call shape
covers chunked prefill (one row, ``T`` tokens) and batched decode (``B`` rows, one token each). New K/V are
scattered into the pool first; attention then reads the rows' slots under an explicit ``key <= query``
mask, so every shape is static and nothing syncs with the host (CUDA-graph capturable). Stale entries beyond
a slot's length are masked, which is why a slot is "reset" just by restarting its positions at 0.

``attend`` is ``write_kv`` (the scatter) then ``attend_pool`` (read only). On CUDA with Triton, decode-sized
calls run ``voxstage.nn.triton_attention``, which reads K/V from the pool by slot and masks by position
in-kernel; elsewhere (CPU, prefill, kernels switched off) the gather + mask + SDPA chain runs unchanged.

Only the family-independent part lives here: projections, q/k norms and the rotary flavour (rotate-half
in fp32 for Qwen3, interleaved on a bf16 table for Audio8) stay with each family, so sharing this changes
no numbers.

With ``kv_cache_dtype: fp8`` the pool holds float8 e4m3 and carries static per-layer, per-KV-head scales
(``voxstage.nn.kv_fp8``, which says why static); every write quantizes and every read dequantizes, passing
a layer's ``scales`` (``KVPool.layer_scales``) along with its pools. Without scales nothing changes.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType
from typing import Self

import torch
import torch.nn.functional as F

from voxstage.nn import fused, kv_fp8

Scales = tuple[torch.Tensor, torch.Tensor] | None  # one layer's (k_scale, v_scale) [kv_heads] fp32, or None


@dataclass
class KVPool:
    """Static K/V: ``k``/``v`` are ``[layers, slots, kv_heads, positions, head_dim]``; with an fp8 pool,
    ``k_scale``/``v_scale [layers, kv_heads]`` (fp32 powers of two) say what one stored unit is worth."""

    k: torch.Tensor
    v: torch.Tensor
    k_scale: torch.Tensor | None = None
    v_scale: torch.Tensor | None = None

    @classmethod
    def zeros(
        cls,
        num_layers: int,
        num_slots: int,
        kv_heads: int,
        max_len: int,
        head_dim: int,
        device: torch.device | str,
        dtype: torch.dtype,
        scales: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> Self:
        """A zeroed pool of ``dtype``; ``scales`` ``(k_scale, v_scale) [layers, kv_heads]`` make it an fp8
        pool (``dtype`` is then the fp8 storage type)."""
        if num_slots <= 0 or max_len <= 0:
            raise ValueError(f"a KV pool needs num_slots > 0 and max_len > 0, got {num_slots}, {max_len}")
        if (scales is not None) != kv_fp8.is_fp8(dtype):
            raise ValueError(f"an fp8 pool needs its scales and only an fp8 pool has them (dtype {dtype})")
        shape = (num_layers, num_slots, kv_heads, max_len, head_dim)
        k, v = (torch.zeros(shape, device=device, dtype=dtype) for _ in range(2))
        if scales is None:
            return cls(k, v)
        k_scale, v_scale = (s.to(device, torch.float32).reshape(num_layers, kv_heads) for s in scales)
        return cls(k, v, k_scale, v_scale)

    @property
    def num_slots(self) -> int:
        return self.k.shape[1]

    @property
    def max_len(self) -> int:
        return self.k.shape[3]

    def layer_scales(self, layer: int) -> Scales:
        """Layer ``layer``'s ``(k_scale, v_scale)`` for the write and read calls, None for a plain pool."""
        if self.k_scale is None or self.v_scale is None:
            return None
        return self.k_scale[layer], self.v_scale[layer]

    def copy_slot(self, src: int, dst: int, n: int) -> None:
        """Positions ``[0, n)`` of slot ``src`` into slot ``dst`` (slot compaction when a request leaves).
        A byte copy in either storage: the fp8 scales are the same for every slot."""
        if n:
            self.k[:, dst, :, :n] = self.k[:, src, :, :n]
            self.v[:, dst, :, :n] = self.v[:, src, :, :n]


KV_CACHE_DTYPES = ("auto", "fp8")  # the deploy key's values once its spellings are read (config/stage.py)


def kv_cache_fp8(name: str) -> bool:
    """Whether ``kv_cache_dtype`` ``name`` asks for an fp8 pool (a family that supports both values)."""
    if name not in KV_CACHE_DTYPES:
        raise ValueError(f"kv_cache_dtype must be one of {', '.join(KV_CACHE_DTYPES)}, got {name!r}")
    return name == "fp8"


def kv_bytes_per_token(num_layers: int, kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
    """K+V bytes one position of one slot occupies across all layers (memory-budget admission); ``dtype`` is
    the pool's storage type (fp8: one byte; its per-head scales are a few KiB per pool, not per slot)."""
    return 2 * num_layers * kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()


def check_call(x: torch.Tensor, positions: torch.Tensor, attn_len: int, pool: KVPool) -> None:
    """The stack call's contract: ``x [B, T, D]`` at ``positions [B, T]``, ``attn_len`` in (0, max_len]."""
    if x.dim() != 3 or positions.shape != x.shape[:2]:
        raise ValueError(
            f"x must be [B, T, D], positions [B, T]; got {tuple(x.shape)}, {tuple(positions.shape)}"
        )
    if not 0 < attn_len <= pool.max_len:
        raise ValueError(f"attn_len must lie in (0, {pool.max_len}], got {attn_len}")


def write_index(positions: torch.Tensor, slot_ids: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(slot [B, 1], position [B, T])``: where each row's new K/V go (an index_put, no sync).
    ``slot_ids`` None means rows ``0..B-1`` (a frame-local scratch cache)."""
    b = positions.shape[0]
    rows = torch.arange(b, device=positions.device) if slot_ids is None else slot_ids
    return rows.unsqueeze(1), positions


def grouped_causal_mask(positions: torch.Tensor, attn_len: int, group: int) -> torch.Tensor:
    """Causal mask over absolute positions (``key <= query``) in the grouped-query layout ``attend`` uses:
    ``[B, 1, group * T, attn_len]``, built once per call and shared by every layer."""
    b, t = positions.shape
    key_pos = torch.arange(attn_len, device=positions.device)
    mask = key_pos.view(1, 1, attn_len) <= positions.unsqueeze(-1)  # [B, T, attn_len]
    return mask.unsqueeze(1).expand(b, group, t, attn_len).reshape(b, 1, group * t, attn_len)


def write_kv(
    k: torch.Tensor,
    v: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    write: tuple[torch.Tensor, torch.Tensor],
    scales: Scales = None,
) -> None:
    """Scatter the rows' ``k``/``v [B, T, kv_heads, hd]`` into one layer's pools ``[slots, kv_heads,
    positions, hd]`` at ``write`` (from ``write_index``), quantized by ``scales`` for an fp8 pool."""
    rows, cols = write  # (slot [B, 1], :, position [B, T]) addresses a [B, T, kv_heads, hd] block
    if scales is None:
        k_pool[rows, :, cols] = k.to(k_pool.dtype)
        v_pool[rows, :, cols] = v.to(v_pool.dtype)
        return
    k_scale, v_scale = (s.view(-1, 1) for s in scales)
    kv_fp8.as_bytes(k_pool)[rows, :, cols] = kv_fp8.as_bytes(kv_fp8.quantize(k, k_scale))
    kv_fp8.as_bytes(v_pool)[rows, :, cols] = kv_fp8.as_bytes(kv_fp8.quantize(v, v_scale))


def attend_pool(
    q: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    slot_ids: torch.Tensor | None,
    attn_len: int,
    mask: torch.Tensor,
    positions: torch.Tensor,
    scales: Scales = None,
    tokens: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """Attend ``q [B, T, heads, hd]`` (rotated) over positions ``[0, attn_len)`` of the rows' slots in one
    layer's pools (read only); returns ``[B, T, heads * hd]`` (before the output projection).

    ``mask`` (``grouped_causal_mask``) and ``positions [B, T]`` state the same ``key <= query`` rule: the
    PyTorch path reads the mask, the Triton decode kernel (CUDA; a prefill's tokens as rows of their own,
    ``token_rows``) the positions, reading K/V from the pool by slot instead of gathering them first.
    ``scales``: an fp8 pool's (the kernel folds them into q.k and the output; the PyTorch path dequantizes
    what it gathered). ``tokens``: each token's slot and position ``[B*T]`` when the caller has them
    already (``StackCall``: one table per forward instead of one per layer)."""
    b, t, nh, hd = q.shape
    kernel = _pool_kernel(q)
    if kernel is not None and t <= MAX_KERNEL_TOKENS:
        return kernel.pool_attention(q, k_pool, v_pool, slot_ids, positions, attn_len, scales=scales)
    if kernel is not None:  # a prefill chunk: each token its own query row
        flat_q, flat_slots, flat_pos = token_rows(q, slot_ids, positions, tokens)
        out = kernel.pool_attention(flat_q, k_pool, v_pool, flat_slots, flat_pos, attn_len, scales=scales)
        return out.view(b, t, nh * hd)
    nkv = k_pool.shape[1]
    group = nh // nkv
    if slot_ids is None:  # a view, not a gather
        keys, values = k_pool[:b, :, :attn_len], v_pool[:b, :, :attn_len]
    elif scales is None:
        keys, values = k_pool[slot_ids, :, :attn_len], v_pool[slot_ids, :, :attn_len]
    else:  # gathered as bytes (fp8 indexing is not on every device)
        keys, values = (kv_fp8.as_bytes(p)[slot_ids, :, :attn_len].view(p.dtype) for p in (k_pool, v_pool))
    # GQA without repeating K/V: each KV head's query group is folded into the query-length axis, so the
    # call is plain multi-head SDPA over kv_heads (query head j uses KV head j // group, as the references;
    # any backend that takes a mask can run it).
    qg = q.reshape(b, t, nkv, group, hd).permute(0, 2, 3, 1, 4).reshape(b, nkv, group * t, hd)
    k_scale, v_scale = (None, None) if scales is None else (s.view(-1, 1, 1) for s in scales)
    keys, values = kv_fp8.load(keys, q.dtype, k_scale), kv_fp8.load(values, q.dtype, v_scale)
    out = F.scaled_dot_product_attention(qg, keys, values, attn_mask=mask)
    return out.view(b, nkv, group, t, hd).permute(0, 3, 1, 2, 4).reshape(b, t, nh * hd)


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    write: tuple[torch.Tensor, torch.Tensor],
    slot_ids: torch.Tensor | None,
    attn_len: int,
    mask: torch.Tensor,
    scales: Scales = None,
) -> torch.Tensor:
    """``write_kv`` then ``attend_pool``: write the rows' ``k``/``v [B, T, kv_heads, hd]`` at ``write``, then
    attend ``q [B, T, heads, hd]`` over the rows' slots; returns ``[B, T, heads * hd]``. ``write``'s second
    element is the call's ``positions [B, T]`` (``write_index``), which the decode kernel masks by."""
    write_kv(k, v, k_pool, v_pool, write, scales)
    return attend_pool(q, k_pool, v_pool, slot_ids, attn_len, mask, write[1], scales)


# The kernel holds all of a KV head's group * T query rows in one tile, which only pays for decode (T = 1, or
# 2 on the code predictor's first step). Above this many tokens per row (a prefill chunk) each token becomes a
# row of its own (``token_rows``): one program per token and KV head walks that token's keys, instead of the
# SDPA path's gather of every row's cache, layout copies and mask (about five launches a layer).
MAX_KERNEL_TOKENS = 4


def token_rows(
    q: torch.Tensor,
    slot_ids: torch.Tensor | None,
    positions: torch.Tensor,
    tokens: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A call of ``B`` rows of ``T`` tokens as ``B * T`` rows of one token: ``q [B*T, 1, heads, hd]``, each
    token's slot ``[B*T]`` and position ``[B*T, 1]`` (from ``tokens``, each token's slot and position, when
    given). A token attends to the keys at or before its position either way: the same attention."""
    b, t = positions.shape
    flat_q = q.reshape(b * t, 1, *q.shape[2:])
    if tokens is not None:
        slots, flat_pos = tokens[0], tokens[1].view(b * t, 1)
    else:
        slots = slot_ids if slot_ids is not None else torch.arange(b, device=positions.device)
        slots, flat_pos = slots.unsqueeze(1).expand(b, t).reshape(b * t), positions.reshape(b * t, 1)
    # The kernel reads one slot per row at unit stride: a one-row chunk's slots are a broadcast (stride 0).
    return flat_q, slots.contiguous(), flat_pos


def _load_kernel() -> ModuleType | None:
    return fused.load_triton_module("triton_attention")  # None without Triton: SDPA runs


def _pool_kernel(q: torch.Tensor) -> ModuleType | None:
    """The Triton module when it applies: CUDA and the ``voxstage.nn.fused`` switch on (one switch for every
    Triton kernel, so benchmarks and A/B tests flip them together)."""
    if not q.is_cuda or not fused.enabled():
        return None
    return _load_kernel()
