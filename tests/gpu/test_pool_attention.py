"""The pool decode-attention Triton kernel equals the SDPA path of ``attend_pool`` on the GPU, eagerly and
replayed from a CUDA graph (needs CUDA + Triton)."""

from __future__ import annotations

import pytest
import torch

from services.talker import kv
from voxstage.nn import fused

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available() or not fused.triton_available(), reason="needs CUDA + Triton"
    ),
]

# (heads, kv_heads, head_dim): Qwen3-TTS talker / code predictor, Audio8 slow / fast AR, a group of 4.
SHAPES = [(16, 8, 128), (14, 2, 64), (8, 2, 128)]
TOL = {torch.bfloat16: 2e-2, torch.float32: 1e-4}


def _case(
    b: int, t: int, heads: int, kv_heads: int, hd: int, attn_len: int, dtype: torch.dtype, slots: bool = True
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """q, a pool with more slots and positions than the call reads (stale data everywhere), scattered slot
    ids and rows at positions from 0 up to attn_len - 1."""
    g = torch.Generator(device="cuda").manual_seed(b * 1000 + t * 100 + hd + attn_len)
    n_slots, max_len = 2 * b + 3, attn_len + 13
    q = torch.randn(b, t, heads, hd, device="cuda", generator=g).to(dtype)
    k_pool = torch.randn(n_slots, kv_heads, max_len, hd, device="cuda", generator=g).to(dtype)
    v_pool = torch.randn(n_slots, kv_heads, max_len, hd, device="cuda", generator=g).to(dtype)
    slot_ids = torch.randperm(n_slots, device="cuda", generator=g)[:b] if slots else None
    last = torch.randint(t - 1, attn_len, (b,), device="cuda", generator=g)
    last[0], last[-1] = t - 1, attn_len - 1  # the extremes: a fresh row and one at the end of the bucket
    positions = last.unsqueeze(1) - torch.arange(t - 1, -1, -1, device="cuda").unsqueeze(0)
    return q, k_pool, v_pool, slot_ids, positions


def _reference(
    q: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    slot_ids: torch.Tensor | None,
    positions: torch.Tensor,
    attn_len: int,
) -> torch.Tensor:
    group = q.shape[2] // k_pool.shape[1]
    mask = kv.grouped_causal_mask(positions, attn_len, group)
    previous = fused.set_triton(False)
    try:
        return kv.attend_pool(q, k_pool, v_pool, slot_ids, attn_len, mask, positions)
    finally:
        fused.set_triton(previous)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("t", [1, 2])
@pytest.mark.parametrize("b", [1, 8])
@pytest.mark.parametrize("attn_len", [77, 2048])
def test_attend_pool_matches_sdpa(
    dtype: torch.dtype, shape: tuple[int, int, int], t: int, b: int, attn_len: int
) -> None:
    q, k_pool, v_pool, slot_ids, positions = _case(b, t, *shape, attn_len, dtype)
    mask = kv.grouped_causal_mask(positions, attn_len, shape[0] // shape[1])
    got = kv.attend_pool(q, k_pool, v_pool, slot_ids, attn_len, mask, positions)  # the kernel (T <= 4)
    want = _reference(q, k_pool, v_pool, slot_ids, positions, attn_len)
    assert got.dtype == dtype and got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=TOL[dtype], atol=TOL[dtype])


@pytest.mark.parametrize("splits", [1, 3, 16])
@pytest.mark.parametrize("slots", [True, False])
def test_key_splits_and_rows_without_slots(splits: int, slots: bool) -> None:
    from voxstage.nn import triton_attention

    q, k_pool, v_pool, slot_ids, positions = _case(3, 2, 16, 8, 128, 1000, torch.float32, slots)
    got = triton_attention.pool_attention(q, k_pool, v_pool, slot_ids, positions, 1000, splits)
    want = _reference(q, k_pool, v_pool, slot_ids, positions, 1000)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("b,t", [(1, 16), (1, 128), (8, 37)])
@pytest.mark.parametrize("slots", [True, False])
def test_a_prefill_chunk_takes_the_kernel_token_by_token(
    dtype: torch.dtype, shape: tuple[int, int, int], b: int, t: int, slots: bool
) -> None:
    """T above MAX_KERNEL_TOKENS (a prefill chunk) runs the kernel with each token as a row of its own
    (``kv.token_rows``), within the decode tolerance of SDPA; a row padded as ``Prefill`` pads (row 0
    again) computes exactly what row 0 does."""
    q, k_pool, v_pool, slot_ids, positions = _case(b, t, *shape, 300, dtype, slots)
    if b > 1 and slot_ids is not None:
        q[-1], positions[-1], slot_ids[-1] = q[0], positions[0], slot_ids[0]
    mask = kv.grouped_causal_mask(positions, 300, shape[0] // shape[1])
    got = kv.attend_pool(q, k_pool, v_pool, slot_ids, 300, mask, positions)
    want = _reference(q, k_pool, v_pool, slot_ids, positions, 300)
    assert got.dtype == dtype and got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=TOL[dtype], atol=TOL[dtype])
    if b > 1 and slot_ids is not None:
        assert torch.equal(got[-1], got[0])


@pytest.mark.parametrize("b", [1, 8])  # batch 1 splits the keys (two kernels), batch 8 does not
def test_cuda_graph_replay_equals_eager(b: int) -> None:
    attn_len, heads, kv_heads, hd = 1024, 16, 8, 128
    q, k_pool, v_pool, slot_ids, positions = _case(b, 1, heads, kv_heads, hd, attn_len, torch.bfloat16)
    assert slot_ids is not None
    # A copy, not the expanded view: the replays below copy new masks into it.
    mask = kv.grouped_causal_mask(positions, attn_len, heads // kv_heads).clone()

    def step() -> torch.Tensor:
        return kv.attend_pool(q, k_pool, v_pool, slot_ids, attn_len, mask, positions)

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # compile and warm up outside the capture
        step()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()

    for seed in range(3):  # new inputs in place, as the engine feeds a captured step
        fresh = _case(b, 1, heads, kv_heads, hd, attn_len, torch.bfloat16)
        for static, new in zip((q, k_pool, v_pool, slot_ids, positions), fresh, strict=True):
            assert new is not None
            static.copy_(new)
        positions[0, 0] = seed  # rows at different depths per replay
        mask.copy_(kv.grouped_causal_mask(positions, attn_len, heads // kv_heads))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, step())
        want = _reference(q, k_pool, v_pool, slot_ids, positions, attn_len)
        torch.testing.assert_close(out, want, rtol=2e-2, atol=2e-2)
