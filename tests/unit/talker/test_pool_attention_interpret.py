"""The pool decode-attention Triton kernel equals the SDPA path of ``attend_pool`` (CPU, Triton interpreter).

Runs only where Triton imports (``TRITON_INTERPRET=1 PYTHONPATH=<triton site>``); CI without Triton skips.
The kernel is launched directly on CPU tensors, since ``attend_pool`` itself takes SDPA off CUDA.
"""

from __future__ import annotations

import os

import pytest
import torch

from services.talker.kv import attend_pool, grouped_causal_mask

pytest.importorskip("triton")
if os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("CPU launches need the Triton interpreter (TRITON_INTERPRET=1)", allow_module_level=True)

import numpy as np  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.runtime import interpreter  # noqa: E402

from voxstage.nn import triton_attention  # noqa: E402  (needs Triton)


@pytest.fixture(autouse=True)
def _interpreter_fixes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two gaps of the Triton 3.5 interpreter that the compiled kernel does not have:

    * scalars are 1-element arrays turned into loop bounds with ``int()``, which NumPy >= 2.4 refuses for
      ndim > 0 (the kernel's key loop has device-side bounds): take the single element. The interpreter
      re-patches ``tl.tensor`` at every launch, so that step is wrapped.
    * ``tl.dot`` multiplies bf16 operands as their raw uint16 storage: widen them to fp32 first (exact).
    """
    patch_tensor = interpreter._patch_lang_tensor
    dot = interpreter.InterpreterBuilder.create_dot

    def patched_tensor(tensor: type) -> None:
        patch_tensor(tensor)
        tensor.__index__ = lambda self: int(self.handle.data.reshape(-1)[0])  # type: ignore[attr-defined]

    def widen(h: interpreter.TensorHandle) -> interpreter.TensorHandle:
        if h.dtype != tl.bfloat16:
            return h
        bits = h.data.astype(np.uint32) << np.uint32(16)  # bf16 is the top half of an fp32
        return interpreter.TensorHandle(bits.view(np.float32), tl.float32)

    Handle = interpreter.TensorHandle

    def patched_dot(self: interpreter.InterpreterBuilder, a: Handle, b: Handle, *rest: object) -> Handle:
        return dot(self, widen(a), widen(b), *rest)

    monkeypatch.setattr(interpreter, "_patch_lang_tensor", patched_tensor)
    monkeypatch.setattr(interpreter.InterpreterBuilder, "create_dot", patched_dot)


def _case(
    group: int, t: int, attn_len: int, dtype: torch.dtype, hd: int = 32, nkv: int = 2, slots: bool = True
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """q, pools (a bigger pool than the batch, filled everywhere, stale data past attn_len included),
    scattered slot ids and per-row positions from 0 to attn_len - 1."""
    g = torch.Generator().manual_seed(1000 * group + 10 * t + attn_len)
    b, n_slots, max_len = 4, 9, attn_len + 7
    q = torch.randn(b, t, nkv * group, hd, generator=g).to(dtype)
    k_pool = torch.randn(n_slots, nkv, max_len, hd, generator=g).to(dtype)
    v_pool = torch.randn(n_slots, nkv, max_len, hd, generator=g).to(dtype)
    slot_ids = torch.tensor([7, 2, 5, 0]) if slots else None
    last = torch.tensor([0, attn_len - 1, attn_len // 2, t - 1])  # each row's final position
    positions = last.unsqueeze(1) - torch.arange(t - 1, -1, -1).unsqueeze(0)
    positions = positions.clamp(min=0)  # a row at 0 with T=2 repeats position 0 (still a valid mask)
    return q, k_pool, v_pool, slot_ids, positions


def _compare(group: int, t: int, attn_len: int, dtype: torch.dtype, splits: int | None, **kw: object) -> None:
    q, k_pool, v_pool, slot_ids, positions = _case(group, t, attn_len, dtype, **kw)  # type: ignore[arg-type]
    mask = grouped_causal_mask(positions, attn_len, group)
    want = attend_pool(q, k_pool, v_pool, slot_ids, attn_len, mask, positions)  # CPU: the SDPA path
    got = triton_attention.pool_attention(q, k_pool, v_pool, slot_ids, positions, attn_len, splits)
    assert got.shape == want.shape and got.dtype == dtype
    if dtype == torch.float32:
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    else:
        torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("group", [1, 2, 4])
@pytest.mark.parametrize("t", [1, 2])
def test_matches_sdpa_fp32(group: int, t: int) -> None:
    _compare(group, t, attn_len=150, dtype=torch.float32, splits=1)  # 150: not a multiple of BLOCK_N


@pytest.mark.parametrize("splits", [2, 3])
@pytest.mark.parametrize("t", [1, 2])
def test_split_keys_match_sdpa(splits: int, t: int) -> None:
    # Rows at position 0 leave later splits empty: the merge must give them zero weight, not NaN.
    _compare(2, t, attn_len=200, dtype=torch.float32, splits=splits)


def test_default_split_choice() -> None:
    _compare(2, 1, attn_len=300, dtype=torch.float32, splits=None)


def test_bf16() -> None:
    _compare(2, 1, attn_len=100, dtype=torch.bfloat16, splits=1)
    _compare(4, 2, attn_len=100, dtype=torch.bfloat16, splits=2)


def test_rows_without_slots_odd_group_and_head_dim() -> None:
    # slot_ids None reads rows 0..B-1; group 7 (Audio8) pads the query tile; head_dim 12 (the tiny preset)
    # pads the feature axis.
    _compare(7, 1, attn_len=70, dtype=torch.float32, splits=1, hd=12, slots=False)
    _compare(7, 2, attn_len=70, dtype=torch.float32, splits=2, hd=12, nkv=1)


def test_does_not_write_the_pool() -> None:
    q, k_pool, v_pool, slot_ids, positions = _case(2, 1, 64, torch.float32)
    k0, v0 = k_pool.clone(), v_pool.clone()
    triton_attention.pool_attention(q, k_pool, v_pool, slot_ids, positions, 64, 2)
    assert torch.equal(k_pool, k0) and torch.equal(v_pool, v0)


def test_split_choice_is_static() -> None:
    # A function of shapes and attn_len only: decode at batch 1 splits a long cache, big batches do not.
    assert triton_attention.choose_splits(1, 8, 2048) > 1
    assert triton_attention.choose_splits(64, 8, 2048) == 1
    assert triton_attention.choose_splits(1, 8, 64) == 1


def test_attend_glue_routes_to_the_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    # attend = write_kv + attend_pool, with the kernel taking the positions from write_index's result.
    from services.talker import kv

    q, k_pool, v_pool, slot_ids, positions = _case(2, 2, 90, torch.float32)
    g = torch.Generator().manual_seed(5)
    k, v = torch.randn(4, 2, 2, 32, generator=g), torch.randn(4, 2, 2, 32, generator=g)
    mask = kv.grouped_causal_mask(positions, 90, 2)
    pools = k_pool.clone(), v_pool.clone()
    want = kv.attend(q, k, v, *pools, kv.write_index(positions, slot_ids), slot_ids, 90, mask)
    monkeypatch.setattr(kv, "_pool_kernel", lambda q: triton_attention)
    got = kv.attend(q, k, v, k_pool, v_pool, kv.write_index(positions, slot_ids), slot_ids, 90, mask)
    assert torch.equal(k_pool, pools[0]) and torch.equal(v_pool, pools[1])
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_strided_q() -> None:
    # The callers hand q over as a view split off a [B, T, heads + kv_heads, hd] tensor (not contiguous).
    q, k_pool, v_pool, slot_ids, positions = _case(2, 1, 80, torch.float32)
    qk = torch.cat((q, torch.randn(4, 1, 2, 32)), dim=2)
    view = qk[:, :, :4]
    assert not view.is_contiguous()
    mask = grouped_causal_mask(positions, 80, 2)
    want = attend_pool(q, k_pool, v_pool, slot_ids, 80, mask, positions)
    got = triton_attention.pool_attention(view, k_pool, v_pool, slot_ids, positions, 80, 2)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("t", [5, 16, 37])
@pytest.mark.parametrize("slots", [True, False])
@pytest.mark.parametrize("group,nkv", [(2, 2), (7, 1)])  # Qwen3-TTS's GQA group, Audio8's odd one
def test_a_prefill_chunk_routes_its_tokens_as_rows(
    monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype, t: int, slots: bool, group: int, nkv: int
) -> None:
    """``attend_pool`` with more than ``MAX_KERNEL_TOKENS`` tokens a row (a prefill chunk) hands the kernel
    one row per token (``token_rows``) and gives the SDPA path's attention: chunks starting after a cached
    prefix, a padding row repeating row 0's slot and positions (as ``Prefill`` pads), or rows 0..B-1."""
    from services.talker import kv

    g = torch.Generator().manual_seed(t)
    hd, attn_len = 32, 90
    starts = torch.tensor([0, 7, 40, 0])
    positions = starts.unsqueeze(1) + torch.arange(t).unsqueeze(0)
    q = torch.randn(4, t, nkv * group, hd, generator=g).to(dtype)
    k_pool = torch.randn(9, nkv, attn_len + 5, hd, generator=g).to(dtype)
    v_pool = torch.randn(9, nkv, attn_len + 5, hd, generator=g).to(dtype)
    slot_ids = torch.tensor([7, 2, 5, 7]) if slots else None
    q[3] = q[0]  # the padding row: row 0 again
    mask = kv.grouped_causal_mask(positions, attn_len, group)
    want = kv.attend_pool(q, k_pool, v_pool, slot_ids, attn_len, mask, positions)  # CPU: SDPA
    monkeypatch.setattr(kv, "_pool_kernel", lambda q: triton_attention)
    got = kv.attend_pool(q, k_pool, v_pool, slot_ids, attn_len, mask, positions)
    assert got.shape == want.shape == (4, t, nkv * group * hd) and got.dtype == dtype
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got.float(), want.float(), rtol=tol, atol=tol)
    if slots:
        assert torch.equal(got[3], got[0])  # a padding row computes what row 0 does


def test_the_qwen3_backbones_fused_prefill_takes_its_call_tables_token_rows(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The talker's fused stack hands a prefill chunk's attention to the kernel with the call's per-token
    slot and position tables (``StackCall``, built once per forward): the same hidden states and K/V as the
    module path (SDPA), within fp32 rounding."""
    from services.talker import kv
    from services.talker.models.qwen3_tts.backbone import KVCache
    from services.talker.models.qwen3_tts.config import parse_config
    from services.talker.models.qwen3_tts.loader import random_init
    from services.talker.models.qwen3_tts.presets import preset_config, preset_generation_config
    from voxstage.nn import fused, triton_kernels

    monkeypatch.setattr(fused, "_kernels_for", lambda t: triton_kernels if fused.enabled() else None)
    monkeypatch.setattr(kv, "_pool_kernel", lambda q: triton_attention if fused.enabled() else None)
    cfg = parse_config(preset_config("qwen3-tts-tiny", "custom_voice"), preset_generation_config())
    backbone = random_init(cfg, seed=3).model.eval()
    gen = torch.Generator().manual_seed(7)
    cache = KVCache.allocate(backbone.cfg, num_slots=4, max_len=48)
    cache.k.copy_(torch.randn(cache.k.shape, generator=gen))
    cache.v.copy_(torch.randn(cache.v.shape, generator=gen))
    x = torch.randn(2, 9, backbone.cfg.hidden_size, generator=gen)
    positions = torch.tensor([[3, 4, 5, 6, 7, 8, 9, 10, 11], [0, 1, 2, 3, 4, 5, 6, 7, 8]])
    out = []
    try:
        for enabled in (True, False):
            fused.set_triton(enabled)
            c = KVCache(cache.k.clone(), cache.v.clone())
            with torch.no_grad():
                out.append((backbone(x, positions, c, torch.tensor([2, 0]), 32), c))
    finally:
        fused.set_triton(True)
    (h1, c1), (h0, c0) = out
    torch.testing.assert_close(h1, h0, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(c1.k, c0.k, rtol=1e-5, atol=1e-5)
