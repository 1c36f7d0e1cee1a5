"""Triton kernels behind ``voxstage.nn.fused`` (imported only on CUDA with Triton present).

Each replaces a chain of small PyTorch kernels in a per-token step, where launch count, not bandwidth,
sets the time: the residual add and RMSNorm that follow every block, the gated unit's SiLU and product, and
RoPE on q/k (after Qwen3's per-head q/k norm) with the K/V write into a cache slot. They compute in fp32 and
round where the unfused PyTorch code rounds, so they agree with it to the last bf16 bit in most elements
(tested on the GPU).

With an fp8 cache (``FP8``) the K/V writes store ``fp8(clamp(x / scale))`` of the activation-dtype value
``x`` the plain cache would hold, with one power-of-two scale per KV head (``voxstage.nn.kv_fp8``): the
same single rounding the PyTorch fallback does.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def add_rmsnorm_kernel(
    x_ptr,
    delta_ptr,
    w_ptr,
    sum_ptr,
    out_ptr,
    stride_x,
    stride_delta,
    stride_sum,
    stride_out,
    n_cols,
    eps,
    HAS_DELTA: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0)
    if HAS_DELTA:
        d = tl.load(delta_ptr + row * stride_delta + cols, mask=mask, other=0.0)
        # The residual sum is rounded to the activation dtype first, as the unfused add stores it.
        x = (x.to(tl.float32) + d.to(tl.float32)).to(sum_ptr.dtype.element_ty)
        tl.store(sum_ptr + row * stride_sum + cols, x, mask=mask)
    xf = x.to(tl.float32)
    var = tl.sum(xf * xf, axis=0) / n_cols + eps
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    y = xf * (w * tl.rsqrt(var))
    tl.store(out_ptr + row * stride_out + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def silu_mul_kernel(y_ptr, out_ptr, stride_y, stride_out, hidden, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < hidden
    gate = tl.load(y_ptr + row * stride_y + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(y_ptr + row * stride_y + hidden + cols, mask=mask, other=0.0)
    # silu rounds to the activation dtype before the product, as F.silu(gate) * up does.
    act = (gate / (1.0 + tl.exp(-gate))).to(up.dtype)
    tl.store(
        out_ptr + row * stride_out + cols, (act.to(tl.float32) * up.to(tl.float32)).to(up.dtype), mask=mask
    )


@triton.jit
def _fp8_units(x, inv_scale, FP8_MAX: tl.constexpr):
    """``x`` (already rounded to the activation dtype, as the plain cache stores it) in fp8 units: times
    the power-of-two ``1 / scale`` (exact), clamped to the finite range; the store's conversion then rounds
    to nearest even, once."""
    y = x.to(tl.float32) * inv_scale
    return tl.minimum(tl.maximum(y, -FP8_MAX), FP8_MAX)


@triton.jit
def rope_kv_kernel(
    qkv_ptr,
    cos_ptr,
    sin_ptr,
    index_ptr,
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    k_scale_ptr,
    v_scale_ptr,
    stride_qkv_row,
    stride_qkv_part,
    stride_index,
    stride_cs_row,
    stride_q_row,
    stride_q_head,
    stride_c_row,
    stride_c_head,
    stride_c_pos,
    HALF: tl.constexpr,
    ROPE: tl.constexpr,
    FP8: tl.constexpr,
    FP8_MAX: tl.constexpr,
):
    """One (row, head): q and k rotated by interleaved RoPE (fp32), q stored, k and v stored at the
    row's cache index (fp8 caches: divided by the head's scale, clamped, converted)."""
    row = tl.program_id(0)
    head = tl.program_id(1)
    i = tl.arange(0, HALF)
    base = qkv_ptr + row * stride_qkv_row + head * (2 * HALF)
    q_re = tl.load(base + 2 * i).to(tl.float32)
    q_im = tl.load(base + 2 * i + 1).to(tl.float32)
    k_re = tl.load(base + stride_qkv_part + 2 * i).to(tl.float32)
    k_im = tl.load(base + stride_qkv_part + 2 * i + 1).to(tl.float32)
    v_re = tl.load(base + 2 * stride_qkv_part + 2 * i)
    v_im = tl.load(base + 2 * stride_qkv_part + 2 * i + 1)
    if ROPE:
        c = tl.load(cos_ptr + row * stride_cs_row + i)
        s = tl.load(sin_ptr + row * stride_cs_row + i)
        q_re, q_im = q_re * c - q_im * s, q_re * s + q_im * c
        k_re, k_im = k_re * c - k_im * s, k_re * s + k_im * c
    out_ty = q_ptr.dtype.element_ty
    q_out = q_ptr + row * stride_q_row + head * stride_q_head
    tl.store(q_out + 2 * i, q_re.to(out_ty))
    tl.store(q_out + 2 * i + 1, q_im.to(out_ty))
    slot = tl.load(index_ptr + row * stride_index)
    offset = row * stride_c_row + head * stride_c_head + slot * stride_c_pos
    cache_ty = k_cache_ptr.dtype.element_ty
    if FP8:
        k_inv = 1.0 / tl.load(k_scale_ptr + head)
        v_inv = 1.0 / tl.load(v_scale_ptr + head)
        k_re = _fp8_units(k_re.to(out_ty), k_inv, FP8_MAX)
        k_im = _fp8_units(k_im.to(out_ty), k_inv, FP8_MAX)
        v_re = _fp8_units(v_re, v_inv, FP8_MAX)
        v_im = _fp8_units(v_im, v_inv, FP8_MAX)
    tl.store(k_cache_ptr + offset + 2 * i, k_re.to(cache_ty))
    tl.store(k_cache_ptr + offset + 2 * i + 1, k_im.to(cache_ty))
    tl.store(v_cache_ptr + offset + 2 * i, v_re.to(cache_ty))
    tl.store(v_cache_ptr + offset + 2 * i + 1, v_im.to(cache_ty))


@triton.jit
def qk_norm_rope_kv_kernel(
    qkv_ptr,
    q_w_ptr,
    k_w_ptr,
    cos_ptr,
    sin_ptr,
    slot_ptr,
    pos_ptr,
    q_ptr,
    k_pool_ptr,
    v_pool_ptr,
    k_scale_ptr,
    v_scale_ptr,
    stride_qkv,
    stride_slot,
    stride_pos,
    stride_cs,
    stride_q_row,
    stride_q_head,
    stride_p_slot,
    stride_p_head,
    stride_p_pos,
    eps,
    NH: tl.constexpr,
    NKV: tl.constexpr,
    HALF: tl.constexpr,
    BLOCK: tl.constexpr,
    FP8: tl.constexpr,
    FP8_MAX: tl.constexpr,
):
    """One (row, head) of Qwen3 attention's input: heads ``[0, NH)`` are q heads, ``[NH, NH + NKV)`` k heads
    (which also carry their v head). Per-head RMSNorm (fp32, rounded to the activation dtype as the norm's
    output is), rotate-half RoPE in fp32 rounded once; q is stored, k and v go to the pools at the row's
    (slot, position), fp8 pools through the KV head's scales."""
    row = tl.program_id(0)
    head = tl.program_id(1)
    i = tl.arange(0, BLOCK)
    m = i < HALF
    act_ty = q_ptr.dtype.element_ty
    src = qkv_ptr + row * stride_qkv + head * (2 * HALF)
    x1 = tl.load(src + i, mask=m, other=0.0).to(tl.float32)
    x2 = tl.load(src + HALF + i, mask=m, other=0.0).to(tl.float32)
    if head < NH:
        w1 = tl.load(q_w_ptr + i, mask=m, other=0.0).to(tl.float32)
        w2 = tl.load(q_w_ptr + HALF + i, mask=m, other=0.0).to(tl.float32)
    else:
        w1 = tl.load(k_w_ptr + i, mask=m, other=0.0).to(tl.float32)
        w2 = tl.load(k_w_ptr + HALF + i, mask=m, other=0.0).to(tl.float32)
    r = tl.rsqrt((tl.sum(x1 * x1, axis=0) + tl.sum(x2 * x2, axis=0)) / (2 * HALF) + eps)
    n1 = (x1 * r * w1).to(act_ty).to(tl.float32)
    n2 = (x2 * r * w2).to(act_ty).to(tl.float32)
    cs = row * stride_cs
    c1 = tl.load(cos_ptr + cs + i, mask=m, other=0.0).to(tl.float32)
    c2 = tl.load(cos_ptr + cs + HALF + i, mask=m, other=0.0).to(tl.float32)
    s1 = tl.load(sin_ptr + cs + i, mask=m, other=0.0).to(tl.float32)
    s2 = tl.load(sin_ptr + cs + HALF + i, mask=m, other=0.0).to(tl.float32)
    # x * cos + rotate_half(x) * sin with rotate_half(x) = [-x2, x1].
    o1 = (n1 * c1 - n2 * s1).to(act_ty)
    o2 = (n2 * c2 + n1 * s2).to(act_ty)
    if head < NH:
        dst = q_ptr + row * stride_q_row + head * stride_q_head
        tl.store(dst + i, o1, mask=m)
        tl.store(dst + HALF + i, o2, mask=m)
    else:
        # Strided: the per-token slot is often one row's slot broadcast over its tokens (stride 0).
        slot = tl.load(slot_ptr + row * stride_slot)
        pos = tl.load(pos_ptr + row * stride_pos)
        offset = slot * stride_p_slot + (head - NH) * stride_p_head + pos * stride_p_pos
        pool_ty = k_pool_ptr.dtype.element_ty
        v_src = src + NKV * (2 * HALF)  # the v head sits NKV heads after its k head
        v1 = tl.load(v_src + i, mask=m, other=0.0)
        v2 = tl.load(v_src + HALF + i, mask=m, other=0.0)
        # New names under the runtime `if head < NH`: Triton refuses a variable whose type differs between
        # the branches (o1 is the activation dtype above; fp8 units are fp32).
        if FP8:
            k_inv = 1.0 / tl.load(k_scale_ptr + head - NH)
            v_inv = 1.0 / tl.load(v_scale_ptr + head - NH)
            ks1 = _fp8_units(o1, k_inv, FP8_MAX)
            ks2 = _fp8_units(o2, k_inv, FP8_MAX)
            vs1 = _fp8_units(v1, v_inv, FP8_MAX)
            vs2 = _fp8_units(v2, v_inv, FP8_MAX)
        else:
            ks1, ks2, vs1, vs2 = o1, o2, v1, v2
        tl.store(k_pool_ptr + offset + i, ks1.to(pool_ty), mask=m)
        tl.store(k_pool_ptr + offset + HALF + i, ks2.to(pool_ty), mask=m)
        tl.store(v_pool_ptr + offset + i, vs1.to(pool_ty), mask=m)
        tl.store(v_pool_ptr + offset + HALF + i, vs2.to(pool_ty), mask=m)
