"""A prefill chunk's tokens as rows of their own (``services.talker.kv.token_rows``, how the Triton pool
kernel takes chunks longer than decode) is the same attention as the chunk's rows: checked here on the
PyTorch path, which runs everywhere (the kernel itself: ``test_pool_attention_interpret.py``)."""

from __future__ import annotations

import pytest
import torch

from services.talker.kv import attend_pool, grouped_causal_mask, token_rows


@pytest.mark.parametrize("slots", [True, False])
def test_tokens_as_rows_attend_as_their_chunk(slots: bool) -> None:
    g = torch.Generator().manual_seed(4)
    b, t, group, nkv, hd, attn_len = 3, 9, 2, 2, 16, 40
    positions = torch.tensor([0, 5, 20]).unsqueeze(1) + torch.arange(t).unsqueeze(0)
    q = torch.randn(b, t, nkv * group, hd, generator=g)
    k_pool = torch.randn(6, nkv, attn_len, hd, generator=g)
    v_pool = torch.randn(6, nkv, attn_len, hd, generator=g)
    slot_ids = torch.tensor([4, 1, 4]) if slots else None
    want = attend_pool(q, k_pool, v_pool, slot_ids, attn_len, grouped_causal_mask(positions, attn_len, group),
                       positions)  # fmt: skip
    flat_q, flat_slots, flat_pos = token_rows(q, slot_ids, positions)
    assert flat_q.shape == (b * t, 1, nkv * group, hd) and flat_pos.shape == (b * t, 1)
    expected_slots = (slot_ids if slots else torch.arange(b)).repeat_interleave(t)
    assert torch.equal(flat_slots, expected_slots)
    mask = grouped_causal_mask(flat_pos, attn_len, group)
    got = attend_pool(flat_q, k_pool, v_pool, flat_slots, attn_len, mask, flat_pos)
    torch.testing.assert_close(got.view(b, t, -1), want, rtol=1e-5, atol=1e-5)


def test_a_calls_token_tables_give_the_same_rows() -> None:
    """``tokens`` (a ``StackCall``'s per-token slots and positions, built once per forward) stand for the
    flattening ``token_rows`` would do itself."""
    positions = torch.tensor([[4, 5, 6], [0, 1, 2]])
    slot_ids = torch.tensor([3, 1])
    q = torch.randn(2, 3, 4, 8)
    own = token_rows(q, slot_ids, positions)
    given = token_rows(q, slot_ids, positions, (torch.tensor([3, 3, 3, 1, 1, 1]), positions.reshape(-1)))
    for a, b in zip(own, given, strict=True):
        assert torch.equal(a, b)


def test_a_lone_chunks_token_slots_are_not_a_broadcast() -> None:
    """The kernel reads one slot per row at unit stride; a one-row chunk's slots, expanded, are a stride-0
    view (reading it row by row ran past its one element on the GPU: an illegal memory access)."""
    positions = torch.arange(16).unsqueeze(0)
    q = torch.randn(1, 16, 2, 4)
    for tokens in (None, (torch.tensor([5]).unsqueeze(1).expand(1, 16).reshape(16), positions.reshape(-1))):
        _, slots, _ = token_rows(q, torch.tensor([5]), positions, tokens)
        assert slots.stride() == (1,) and slots.tolist() == [5] * 16
