"""The codec's tick policy: earliest playback deadline first, chunks with slack spread over ticks.

First on bare stream states (the rule), then on the engine with the real tiny decoder and a clock the test
moves: which streams a tick decodes, and that deferring a chunk never changes a stream's audio.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.unit.codec.test_engine import GROUPS, SEED_SCHEDULE, TOL, codes_for, collect, offline
from voxstage.codec.engine import CodecEngine, CodecOutput
from voxstage.codec.engine_state import StreamState
from voxstage.codec.models.qwen3_tts.decoder import Qwen3TokenizerDecoder
from voxstage.codec.models.qwen3_tts.loader import random_init
from voxstage.codec.models.qwen3_tts.presets import decoder_preset
from voxstage.codec.models.qwen3_tts.streaming import StreamingDecoder
from voxstage.codec.tick_plan import TickPolicy, deadline

SR = 24000


def state(
    sid: str, *, opened: float = 0.0, first_out: float | None = None, audio_s: float = 0.0
) -> StreamState:
    s = StreamState(sid, 0, 1, opened_at=opened)
    s.first_out_at = first_out
    s.sample_offset = round(audio_s * SR)
    return s


def frames(_: StreamState, n: int) -> int:
    return n


def picked(policy: TickPolicy, work: list[tuple[StreamState, int]], now: float) -> list[str]:
    return [s.stream_id for s, _ in policy.pick(work, now, SR, frames)]


def test_deadline_is_first_audio_plus_the_audio_handed_out() -> None:
    assert deadline(state("young", opened=3.0), SR) == 3.0  # nothing out yet: due when it opened
    assert deadline(state("old", opened=1.0, first_out=1.5, audio_s=2.0), SR) == pytest.approx(3.5)


def test_chunks_go_in_deadline_order_and_slack_rich_ones_wait_past_the_budget() -> None:
    policy = TickPolicy("deadline", frame_budget=30, slack_s=0.25)
    rich = state("rich", first_out=0.0, audio_s=4.0)  # due at 4.0
    richer = state("richer", first_out=0.0, audio_s=6.0)
    tight = state("tight", first_out=0.0, audio_s=1.1)  # due at 1.1: 0.1 s of slack at now = 1.0
    young = state("young", opened=0.9)
    work = [(richer, 25), (rich, 25), (tight, 25), (young, 1)]
    # young (due at open) and tight go whatever they cost; rich/richer would take the tick past 30 frames.
    assert picked(policy, work, now=1.0) == ["young", "tight"]
    # Within the budget, slack-rich chunks go too (most urgent first), so the device is not left idle.
    everything = ["young", "tight", "rich", "richer"]
    assert picked(TickPolicy("deadline", frame_budget=76), work, now=1.0) == everything
    assert picked(TickPolicy("deadline", frame_budget=51), work, now=1.0) == ["young", "tight", "rich"]
    # Once its slack is under slack_s a chunk goes over budget: no stream is deferred into a gap.
    assert picked(policy, work, now=3.8) == ["young", "tight", "rich"]


def test_a_tick_always_decodes_its_most_urgent_chunk() -> None:
    big = state("big", first_out=0.0, audio_s=9.0)
    assert picked(TickPolicy("deadline", frame_budget=10), [(big, 100)], now=0.0) == ["big"]


def test_fifo_decodes_every_ready_chunk_in_arrival_order() -> None:
    work = [(state("a", first_out=0.0, audio_s=9.0), 100), (state("b", opened=5.0), 1)]
    assert picked(TickPolicy("fifo", frame_budget=1), work, now=0.0) == ["a", "b"]


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [({"mode": "lifo"}, "mode"), ({"frame_budget": 0}, "frame_budget"), ({"slack_s": 0.0}, "slack_s")],
)
def test_bad_policy_values_name_the_field(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        TickPolicy(**kwargs)  # type: ignore[arg-type]


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(scope="module")
def model() -> Qwen3TokenizerDecoder:
    return random_init(decoder_preset("qwen3-tts-tiny"), seed=0)


def test_engine_defers_slack_rich_chunks_and_their_audio_is_unchanged(model: Qwen3TokenizerDecoder) -> None:
    engine = CodecEngine(
        StreamingDecoder(model, 8), max_streams=4, schedule=SEED_SCHEDULE, num_groups=GROUPS,
        policy=TickPolicy("deadline", frame_budget=40, slack_s=0.25),
    )  # fmt: skip
    clock = Clock()
    engine.clock = clock
    codes = {sid: codes_for(i, 57) for i, sid in enumerate(("a", "b", "c"))}
    got: dict[str, list[CodecOutput]] = {}
    for sid in codes:  # each plays its ramp (1, 1, 2, 4, 8, 16: 32 frames = 2.56 s of audio) at once
        engine.open(sid)
        engine.push(sid, codes[sid][:32])
    while engine.has_work():
        collect(engine.step(), got)
    assert {sid: sum(o.frames for o in got[sid]) for sid in codes} == dict.fromkeys(codes, 32)
    # 10 ms later each has a steady 25-frame chunk in and 2.55 s of slack; a young stream opens.
    clock.now += 0.01
    for sid in codes:
        engine.push(sid, codes[sid][32:57])
    young = codes_for(7, 1)
    engine.open("young")
    engine.push("young", young)
    out = engine.step()
    assert [(o.stream_id, o.frames) for o in out] == [("young", 1), ("a", 25)]  # 26 of 40: b and c wait
    collect(out, got)
    out = engine.step()
    assert [(o.stream_id, o.frames) for o in out] == [("b", 25)]
    collect(out, got)
    out = engine.step()
    assert [(o.stream_id, o.frames) for o in out] == [("c", 25)]
    collect(out, got)
    for sid in (*codes, "young"):
        engine.finish(sid)
    while engine.has_work():
        collect(engine.step(), got)
    assert engine.active() == 0
    for sid, c in codes.items():
        pcm = np.concatenate([o.pcm for o in got[sid]])
        np.testing.assert_allclose(pcm, offline(model, c), atol=TOL, rtol=0)
    np.testing.assert_allclose(np.concatenate([o.pcm for o in got["young"]]), offline(model, young), atol=TOL)
