"""Decode attention straight out of the talker's static KV pool (imported only where Triton is present).

The PyTorch path (``services.talker.kv.attend_pool``) gathers every row's ``[kv_heads, attn_len, hd]`` K and
V out of the pool, folds the GQA group into the query axis and runs SDPA under a boolean mask: per layer call
two full copies of the rows' caches plus the mask conversion and layout copies around one attention kernel.
Here one program owns one (row, KV head) pair and all ``group * T`` query rows that read that head, so each
K/V tile is loaded once from ``pool[slot, kv_head, pos, :]`` and shared by the whole query group (one
``tl.dot`` per tile). Keys past a query's absolute position are masked in-kernel, which is exactly the
``key <= query`` rule of ``grouped_causal_mask``; softmax runs online in fp32.

With few rows (batch 1 decode) a program per (row, KV head) would leave most SMs idle while it walks a long
cache, so the key range is split across programs (flash-decoding): each writes an unnormalised partial
``(acc, max, sum)`` and a second kernel merges them. The split count depends only on shapes and on
``attn_len``, a Python int fixed per captured graph, so the grid is static and nothing syncs with the host
(CUDA-graph capturable). Each program stops at its row's furthest query position (a device-side loop bound),
so a short row in a long bucket reads only its own prefix.

An fp8 pool (``kv_cache_dtype: fp8``) is read as is: each tile is converted to the query's dtype (exact for
e4m3) and the KV head's power-of-two scales are folded into the logit scale (K) and into the accumulator
(V), which is exactly dequantizing first; the bytes read per key halve.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK_N = 64  # keys per tile: a [64, 128] bf16 K tile is 16 KiB, small enough to double-buffer
MIN_BLOCKS_PER_SPLIT = 2  # a split shorter than this costs more in its partial write than it saves
TARGET_PROGRAMS = 128  # about one program per SM of an H100/H200; beyond that splitting stops paying
# A finite "minus infinity" (a constexpr: kernels read no other globals): a fully masked tile then gives
# exp2(-inf - NEG) = 0, never NaN.
NEG = tl.constexpr(-1.0e30)
LOG2E = 1.4426950408889634


@triton.jit
def _query_rows(kvh, n_tokens, GROUP: tl.constexpr, BLOCK_M: tl.constexpr):
    """The tile's query rows: row r is token r // GROUP of query head kvh * GROUP + r % GROUP (GQA: head j
    reads KV head j // GROUP); rows past the call's tokens are padding."""
    rows = tl.arange(0, BLOCK_M)
    tok = rows // GROUP
    return rows, tok, kvh * GROUP + rows % GROUP, tok < n_tokens


@triton.jit
def pool_attention_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    k_scale_ptr,
    v_scale_ptr,
    slot_ptr,
    pos_ptr,
    out_ptr,
    part_acc_ptr,
    part_ml_ptr,
    stride_qb,
    stride_qt,
    stride_qh,
    stride_qd,
    stride_ks,
    stride_kh,
    stride_kp,
    stride_kd,
    stride_vs,
    stride_vh,
    stride_vp,
    stride_vd,
    stride_pb,
    stride_pt,
    stride_ob,
    stride_ot,
    n_tokens,
    attn_len,
    keys_per_split,
    qk_scale,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    HAS_SLOTS: tl.constexpr,
    SPLIT: tl.constexpr,
    IEEE: tl.constexpr,
    FP8: tl.constexpr,
):
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    rows, tok, head, row_ok = _query_rows(kvh, n_tokens, GROUP, BLOCK_M)
    dims = tl.arange(0, BLOCK_D)
    d_ok = dims < HEAD_DIM
    q_off = b * stride_qb + tok[:, None] * stride_qt + head[:, None] * stride_qh + dims[None, :] * stride_qd
    q = tl.load(q_ptr + q_off, mask=row_ok[:, None] & d_ok[None, :], other=0.0)
    # Padding rows take position 0 (they see key 0 only): finite everywhere, and never stored.
    qpos = tl.load(pos_ptr + b * stride_pb + tok * stride_pt, mask=row_ok, other=0)
    if HAS_SLOTS:
        slot = tl.load(slot_ptr + b).to(tl.int64)
    else:
        slot = b.to(tl.int64)
    k_base = k_ptr + slot * stride_ks + kvh * stride_kh
    v_base = v_ptr + slot * stride_vs + kvh * stride_vh
    if FP8:  # stored K is k / k_scale: q.k = (q . stored) * k_scale, exactly (a power of two)
        qk_scale = qk_scale * tl.load(k_scale_ptr + kvh)

    start = split * keys_per_split
    # No key beyond the row's furthest query position can be unmasked: stop there (a device-side loop
    # bound, so a short row in a long bucket reads only its own prefix; the grid stays static).
    end = tl.minimum(tl.minimum(start + keys_per_split, attn_len), tl.max(qpos, axis=0) + 1).to(tl.int32)
    m_i = tl.full([BLOCK_M], NEG, tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    for n0 in range(start, end, BLOCK_N):
        kpos = n0 + tl.arange(0, BLOCK_N)
        k_ok = kpos < end
        tile_mask = k_ok[:, None] & d_ok[None, :]
        k = tl.load(k_base + kpos[:, None] * stride_kp + dims[None, :] * stride_kd, mask=tile_mask, other=0.0)
        k = k.to(q.dtype)
        if IEEE:  # fp32 inputs: full-precision products, not TF32 (the fp32 reference is exact SDPA)
            s = tl.dot(q, tl.trans(k), input_precision="ieee")
        else:
            s = tl.dot(q, tl.trans(k))
        s = s * qk_scale  # 1/sqrt(hd) with log2(e) folded in, so the softmax runs on exp2
        visible = (kpos[None, :] <= qpos[:, None]) & k_ok[None, :]
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v = tl.load(v_base + kpos[:, None] * stride_vp + dims[None, :] * stride_vd, mask=tile_mask, other=0.0)
        v = v.to(q.dtype)
        if IEEE:
            pv = tl.dot(p, v, input_precision="ieee")
        else:  # p rounded to the activation dtype for the tensor-core product, as flash kernels do
            pv = tl.dot(p.to(v.dtype), v)
        acc = acc * alpha[:, None] + pv
        m_i = m_new
    if FP8:  # stored V is v / v_scale; the output (and every split's partial) is linear in V
        acc = acc * tl.load(v_scale_ptr + kvh)

    if SPLIT:
        n_splits = tl.num_programs(2)
        part = (b * tl.num_programs(1) + kvh) * n_splits + split
        tl.store(part_acc_ptr + part * BLOCK_M * BLOCK_D + rows[:, None] * BLOCK_D + dims[None, :], acc)
        tl.store(part_ml_ptr + part * 2 * BLOCK_M + rows, m_i)
        tl.store(part_ml_ptr + part * 2 * BLOCK_M + BLOCK_M + rows, l_i)
    else:
        out = acc / l_i[:, None]
        o_off = b * stride_ob + tok[:, None] * stride_ot + head[:, None] * HEAD_DIM + dims[None, :]
        tl.store(out_ptr + o_off, out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])


@triton.jit
def pool_attention_merge_kernel(
    part_acc_ptr,
    part_ml_ptr,
    out_ptr,
    stride_ob,
    stride_ot,
    n_tokens,
    n_splits,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    rows, tok, head, row_ok = _query_rows(kvh, n_tokens, GROUP, BLOCK_M)
    dims = tl.arange(0, BLOCK_D)
    d_ok = dims < HEAD_DIM
    first = (b * tl.num_programs(1) + kvh) * n_splits
    m = tl.full([BLOCK_M], NEG, tl.float32)
    total = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    for i in range(0, n_splits):
        part = first + i
        m_s = tl.load(part_ml_ptr + part * 2 * BLOCK_M + rows)
        l_s = tl.load(part_ml_ptr + part * 2 * BLOCK_M + BLOCK_M + rows)
        a_s = tl.load(part_acc_ptr + part * BLOCK_M * BLOCK_D + rows[:, None] * BLOCK_D + dims[None, :])
        m_new = tl.maximum(m, m_s)
        # An empty split (past the row's position) has m_s = NEG, l_s = 0: its weight underflows to 0.
        old, new = tl.exp2(m - m_new), tl.exp2(m_s - m_new)
        total = total * old + l_s * new
        acc = acc * old[:, None] + a_s * new[:, None]
        m = m_new
    out = acc / total[:, None]
    o_off = b * stride_ob + tok[:, None] * stride_ot + head[:, None] * HEAD_DIM + dims[None, :]
    tl.store(out_ptr + o_off, out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])


def _pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def choose_splits(rows: int, kv_heads: int, attn_len: int) -> int:
    """Key-range splits per (row, KV head): enough programs to fill the GPU, none shorter than
    ``MIN_BLOCKS_PER_SPLIT`` tiles. A function of shapes and ``attn_len`` only (static per graph)."""
    blocks = _cdiv(attn_len, BLOCK_N)
    want = _cdiv(TARGET_PROGRAMS, rows * kv_heads)
    return max(1, min(want, blocks // MIN_BLOCKS_PER_SPLIT))


def pool_attention(
    q: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    slot_ids: torch.Tensor | None,
    positions: torch.Tensor,
    attn_len: int,
    num_splits: int | None = None,
    scales: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """``q [B, T, heads, hd]`` over positions ``[0, attn_len)`` of slots ``slot_ids [B]`` (None: rows
    ``0..B-1``) of one layer's pools ``[slots, kv_heads, positions, hd]``, keys at most ``positions [B, T]``;
    returns ``[B, T, heads * hd]`` in q's dtype. ``num_splits`` overrides the key-range split (tests);
    ``scales`` ``(k_scale, v_scale) [kv_heads]`` fp32: the pools are fp8 (``voxstage.nn.kv_fp8``)."""
    b, t, nh, hd = q.shape
    nkv = k_pool.shape[1]
    group = nh // nkv
    block_m = max(16, _pow2(group * t))  # tl.dot needs at least 16 rows
    block_d = max(16, _pow2(hd))
    blocks = _cdiv(attn_len, BLOCK_N)
    splits = choose_splits(b, nkv, attn_len) if num_splits is None else num_splits
    splits = max(1, min(splits, blocks))
    per_split = _cdiv(blocks, splits)
    splits = _cdiv(blocks, per_split)  # no split left with an empty key range
    out = torch.empty(b, t, nh * hd, device=q.device, dtype=q.dtype)
    if splits > 1:
        part_acc = torch.empty(b * nkv * splits * block_m * block_d, device=q.device, dtype=torch.float32)
        part_ml = torch.empty(b * nkv * splits * 2 * block_m, device=q.device, dtype=torch.float32)
    else:
        part_acc = part_ml = out  # unused
    slots = slot_ids if slot_ids is not None else positions  # unused without slots
    k_scale, v_scale = scales if scales is not None else (out, out)  # unused without fp8
    pool_attention_kernel[(b, nkv, splits)](
        q, k_pool, v_pool, k_scale, v_scale, slots, positions, out, part_acc, part_ml,
        *q.stride(), *k_pool.stride(), *v_pool.stride(), *positions.stride(), out.stride(0), out.stride(1),
        t, attn_len, per_split * BLOCK_N, LOG2E / hd**0.5,
        GROUP=group, HEAD_DIM=hd, BLOCK_M=block_m, BLOCK_N=BLOCK_N, BLOCK_D=block_d,
        HAS_SLOTS=slot_ids is not None, SPLIT=splits > 1, IEEE=q.dtype == torch.float32,
        FP8=scales is not None, num_warps=4,
    )  # fmt: skip
    if splits > 1:
        pool_attention_merge_kernel[(b, nkv)](
            part_acc, part_ml, out, out.stride(0), out.stride(1), t, splits,
            GROUP=group, HEAD_DIM=hd, BLOCK_M=block_m, BLOCK_D=block_d, num_warps=4,
        )  # fmt: skip
    return out
