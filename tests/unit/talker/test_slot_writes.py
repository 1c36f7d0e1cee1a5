"""Admission writes gathered per tick (services/talker/slot_writes.py): the same state as the writes made one
at a time, in one indexed write per tensor, and the same frames from the engine either way."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
import torch

from services.talker.engine import EngineConfig, TalkerEngine
from services.talker.models.qwen3_tts.adapter import Qwen3TTSAdapter
from services.talker.models.qwen3_tts.model import Qwen3TTSTalker
from services.talker.models.qwen3_tts.tokenizer import QwenTextTokenizer
from services.talker.slot_writes import IMMEDIATE, SlotWrites
from tests.unit.talker.talker_kit import drive, frames_of
from tests.unit.talker.test_talker_engine import GREEDY, SAMPLED, request


def tensors() -> dict[str, torch.Tensor]:
    return {
        "seen": torch.ones(6, 5, dtype=torch.bool),
        "count": torch.full((6,), 7, dtype=torch.int64),
        "temp": torch.full((6,), 0.5, dtype=torch.float32),
        "text": torch.full((6, 8), -1, dtype=torch.int64),
    }


def apply(writes: object, t: dict[str, torch.Tensor]) -> None:
    w = writes  # ImmediateWrites or SlotWrites: the same calls
    for slot in (4, 1, 2):
        w.put(t["seen"], slot, False)  # type: ignore[attr-defined]
        w.put(t["count"], slot, 0)  # type: ignore[attr-defined]
        w.put(t["temp"], slot, 0.25 * slot)  # type: ignore[attr-defined]
        w.span(t["text"], slot, 0, [slot, slot + 10])  # type: ignore[attr-defined]
    w.put(t["count"], 1, 3)  # type: ignore[attr-defined]  # a later write to a place replaces the earlier one
    w.span(t["text"], 1, 1, [99, 98, 97])  # type: ignore[attr-defined]
    w.span(t["text"], 2, 0, [])  # type: ignore[attr-defined]


def test_gathered_writes_leave_the_state_the_immediate_ones_leave() -> None:
    one_by_one, gathered = tensors(), tensors()
    apply(IMMEDIATE, one_by_one)
    writes = SlotWrites()
    apply(writes, gathered)
    assert len(writes) == 3 * 3 + 8  # distinct places: three rows in each of three tensors, eight text cells
    untouched = tensors()
    assert all(torch.equal(gathered[k], untouched[k]) for k in gathered)  # nothing before the flush
    writes.flush()
    for k in one_by_one:
        assert torch.equal(gathered[k], one_by_one[k]), k
    assert len(writes) == 0
    assert gathered["count"].tolist() == [7, 3, 0, 7, 0, 7]
    assert gathered["text"][1].tolist() == [1, 99, 98, 97, -1, -1, -1, -1]


def test_flush_makes_one_indexed_write_per_tensor(monkeypatch: pytest.MonkeyPatch) -> None:
    from services.talker import slot_writes

    calls: list[tuple[int, ...]] = []
    uploads: list[torch.dtype] = []
    index_put = torch.Tensor.index_put_
    to_device = slot_writes.to_device

    def counted(self: torch.Tensor, *a: object, **k: object) -> torch.Tensor:
        calls.append(tuple(self.shape))
        return index_put(self, *a, **k)  # type: ignore[arg-type]

    def counted_upload(host: torch.Tensor, device: torch.device) -> torch.Tensor:
        uploads.append(host.dtype)
        return to_device(host, device)

    monkeypatch.setattr(torch.Tensor, "index_put_", counted)
    monkeypatch.setattr(slot_writes, "to_device", counted_upload)
    monkeypatch.setattr(slot_writes, "upload", lambda v, d: counted_upload(torch.tensor(v), d))
    t = tensors()
    writes = SlotWrites()
    apply(writes, t)
    writes.flush()
    assert sorted(calls) == sorted(tuple(x.shape) for x in t.values())
    # One upload of every place, one of the values of each dtype (bool, int64, float32), not two a tensor.
    want = [torch.int64, torch.bool, torch.int64, torch.float32]
    assert sorted(map(str, uploads)) == sorted(map(str, want))


@pytest.mark.parametrize("sampling", [SAMPLED, GREEDY])
def test_an_engine_admitting_a_burst_makes_the_same_frames_either_way(
    tiny_custom_voice: Qwen3TTSTalker, tiny_tokenizer: QwenTextTokenizer, sampling: object
) -> None:
    # Streaming mode: the text is fed one token a frame from the slot's queue, which admission writes too.
    reqs = [request(i, sampling, frames=10, non_streaming=False) for i in range(6)]  # type: ignore[arg-type]

    def run(gathered: bool) -> dict[str, np.ndarray]:
        adapter = Qwen3TTSAdapter(tiny_custom_voice, tiny_tokenizer)
        if not gathered:
            adapter.batched_writes = contextlib.nullcontext  # type: ignore[method-assign]  # one write at a time
        cfg = EngineConfig(
            max_num_seqs=4, max_model_len=192, max_num_batched_tokens=64, async_scheduling=True
        )
        engine = TalkerEngine(adapter, cfg)
        # All at once: the first tick admits four together, later ones refill freed slots.
        for r in reqs:
            engine.submit(r)
        return {k: frames_of(v) for k, v in drive(engine, []).items()}

    batched, single = run(True), run(False)
    assert set(batched) == {r.request_id for r in reqs}
    for k in batched:
        assert np.array_equal(batched[k], single[k]), k
