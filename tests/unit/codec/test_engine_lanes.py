"""The codec engine's two lanes (``codec_urgent_lane_ms``, services/codec/lanes.py) on the real tiny decoder:
the audio equals the offline decode, first and ramp chunks go on the urgent lane and steady chunks on the bulk
lane, a young stream's chunk launches and comes out while a bulk tick is still running, nothing waits on an
unfinished tick, and a stream cancelled with a decode in flight keeps its slot until that decode is in.

Off a GPU the decodes finish before they return; a test that needs a tick still running holds its read-back
event (``held_events``), which is how the engine sees a decode on the device."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from services.codec import engine as engine_mod
from services.codec import lanes as lanes_mod
from services.codec.calls import DecodeCalls
from services.codec.engine import ChunkSchedule, CodecOutput
from services.codec.lanes import POLL_S, LanedCodecEngine
from services.codec.models.qwen3_tts.decoder import Qwen3TokenizerDecoder
from services.codec.models.qwen3_tts.loader import random_init
from services.codec.models.qwen3_tts.presets import decoder_preset
from services.codec.models.qwen3_tts.streaming import StreamingDecoder
from services.codec.worker import CodecWorker
from tests.unit.codec.test_engine import GROUPS, TOL, codes_for, collect, feed, offline
from tests.unit.codec.test_engine_deadline import BUCKETS, MS, SIX_STREAMS, h200_like, six_streams_codes
from voxstage import metrics
from voxstage.stage.engine_loop import run_until_idle
from voxstage.stage.faults import DeviceStalled, is_device_error


@pytest.fixture(scope="module")
def model() -> Qwen3TokenizerDecoder:
    return random_init(decoder_preset("qwen3-tts-tiny"), seed=0)


class CountedCalls(DecodeCalls):
    """The engine's eager decode, recording each call's (rows, frame bucket)."""

    def __init__(self, pool: StreamingDecoder) -> None:
        super().__init__(pool.decode)
        self.shapes: list[tuple[int, int]] = []
        self.rows: list[int] = []  # every real row's frames

    def __call__(self, codes: torch.Tensor, slots: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        self.shapes.append((codes.shape[0], codes.shape[2]))
        self.rows += [n for n in lengths.tolist() if n]
        return super().__call__(codes, slots, lengths)


def laned(
    model: Qwen3TokenizerDecoder,
    streams: int,
    policy: str = "deadline",
    bulk_ms: float = 60,
    urgent_ms: float = 10,
) -> tuple[LanedCodecEngine, CountedCalls, CountedCalls]:
    pool = StreamingDecoder(model, 2 * streams)
    bulk, urgent = CountedCalls(pool), CountedCalls(pool)
    engine = LanedCodecEngine(
        pool, max_streams=streams, schedule=ChunkSchedule(1, 25), num_groups=GROUPS, frame_buckets=BUCKETS,
        decode_fn=bulk, urgent_calls=urgent, urgent_budget_s=urgent_ms * MS, async_scheduling=True,
        tick_policy=policy, tick_budget_s=bulk_ms * MS, cost=h200_like(streams),
    )  # fmt: skip
    return engine, bulk, urgent


def drive(
    engine: LanedCodecEngine, plan: dict[str, tuple[int, int, int]], codes: dict[str, np.ndarray]
) -> dict[str, list[CodecOutput]]:
    """Open, feed and finish streams by ``plan`` (start tick, frames, frames a tick), stepping as the engine
    thread does, and run to the end."""
    out: dict[str, list[CodecOutput]] = {}
    fed = dict.fromkeys(plan, 0)
    for tick in range(400):
        feed(engine, plan, codes, fed, tick)
        if engine.has_work():
            collect(engine.step(), out)
        if all(fed[s] == plan[s][1] for s in plan) and not engine.has_work() and not engine.active():
            break
    run_until_idle(engine, lambda outputs: collect(outputs, out))
    return out


@pytest.mark.parametrize("policy", ["deadline", "fifo"])
def test_two_lanes_give_the_offline_audio_with_young_chunks_on_the_urgent_lane(
    model: Qwen3TokenizerDecoder, policy: str
) -> None:
    plan, codes = SIX_STREAMS, six_streams_codes()
    engine, bulk, urgent = laned(model, streams=6, policy=policy)
    before = lane_counts()
    out = drive(engine, plan, codes)
    assert engine.active() == 0 and not engine._in_flight_groups()
    for sid, (_, frames, _) in plan.items():
        outs = out[sid]
        assert outs[-1].final and sum(o.frames for o in outs) == frames
        np.testing.assert_allclose(
            np.concatenate([o.pcm for o in outs]), offline(model, codes[sid]), atol=TOL, rtol=0
        )
    # First and ramp chunks (1, 1, 2, 4, 8, 16 frames) and the short ends within the ramp (c's 11, e's 1) on
    # the urgent lane; steady chunks (25 frames, or more where a stream is behind) and the short ends past
    # the ramp (b's 21, d's 19, f's 8) on the bulk lane, each lane's calls within its budget.
    assert urgent.shapes and bulk.shapes
    assert sorted(urgent.rows) == sorted([1, 1, 2, 4, 8, 16] * 4 + [1, 1, 2, 4, 8, 11] + [1, 1, 2, 4, 1])
    assert sorted(n for n in bulk.rows if n < 25) == [8, 19, 21]
    # The lanes' metrics count the same calls and their frame rows (batch bucket x frame bucket).
    grew = {k: v - before[k] for k, v in lane_counts().items()}
    for name, calls in (("urgent", urgent), ("bulk", bulk)):
        assert grew[f"{name} calls"] == len(calls.shapes)
        assert grew[f"{name} rows"] == sum(b * t for b, t in calls.shapes)
    assert all(engine.cost(b, t) <= 10 * MS or b == 1 for b, t in urgent.shapes)  # type: ignore[misc]
    if policy == "deadline":
        assert all(engine.cost(b, t) <= 60 * MS or b == 1 for b, t in bulk.shapes)  # type: ignore[misc]


def lane_counts() -> dict[str, float]:
    def sample(name: str, lane: str) -> float:
        return metrics.REGISTRY.get_sample_value(name, {"lane": lane}) or 0.0

    return {
        f"{lane} {what}": sample(f"voxstage_codec_lane_{what}_total", lane)
        for lane in ("urgent", "bulk")
        for what in ("calls", "rows")
    }


@pytest.fixture
def held_events(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[RunningDecode]]:
    """Every launched decode's read-back event, unfinished until the test releases it."""
    events: list[RunningDecode] = []
    real = engine_mod.read_back

    def read_back(wav: torch.Tensor) -> tuple[torch.Tensor, RunningDecode]:
        pcm, _ = real(wav)
        events.append(RunningDecode())
        return pcm, events[-1]

    monkeypatch.setattr(engine_mod, "read_back", read_back)
    yield events


class RunningDecode:
    """A decode's read-back event that is unfinished until the test says so, and that must not be waited on
    (unlike test_engine.py's ``HeldEvent``, which a wait releases)."""

    def __init__(self) -> None:
        self.finished = False

    def query(self) -> bool:
        return self.finished

    def synchronize(self) -> None:
        assert self.finished, "the engine waited on a decode that is still running"


def test_a_young_chunk_launches_and_comes_out_while_a_bulk_tick_runs(
    model: Qwen3TokenizerDecoder, held_events: list[RunningDecode]
) -> None:
    engine, bulk, urgent = laned(model, streams=4)
    old = codes_for(60, 50)
    engine.open("old", initial_frames=25)
    engine.push("old", old[:25])
    engine.step()  # its first chunk: urgent (no audio out yet)
    held_events[-1].finished = True
    outs = engine.step()
    assert [o.stream_id for o in outs] == ["old"] and len(urgent.shapes) == 1
    engine.push("old", old[25:])
    engine.step()  # its steady chunk: the bulk lane, and held there (still running on the device)
    assert bulk.shapes == [(1, 25)]
    bulk_event = held_events[-1]
    assert not engine.has_work() and engine.idle_timeout() == POLL_S  # polls; does not wait on it
    young = codes_for(61, 4)
    engine.open("young")
    engine.push("young", young[:1])
    assert engine.has_work()
    engine.step()  # launches the young stream's first chunk beside the running bulk tick
    assert len(urgent.shapes) == 2
    held_events[-1].finished = True
    outs = engine.step()
    assert [o.stream_id for o in outs] == ["young"]  # out while the bulk tick is still running
    engine.push("young", young[1:2])
    engine.step()
    held_events[-1].finished = True
    assert [o.stream_id for o in engine.step()] == ["young"]
    bulk_event.finished = True
    assert engine.has_work()
    outs = engine.step()
    assert [(o.stream_id, o.frames) for o in outs] == [("old", 25)]


def one_decode_running(model: Qwen3TokenizerDecoder, seed: int) -> LanedCodecEngine:
    """An engine of two slots whose stream "a" has its first chunk launched and still running
    (``held_events``)."""
    engine, _, _ = laned(model, streams=2)
    engine.open("a")
    engine.push("a", codes_for(seed, 1))
    engine.step()
    return engine


def test_a_cancelled_streams_slot_waits_for_its_decode_in_flight(
    model: Qwen3TokenizerDecoder, held_events: list[RunningDecode]
) -> None:
    engine = one_decode_running(model, seed=62)
    slot_a = engine._streams["a"].slot
    assert engine.cancel("a")
    # The next stream must not get a's slot: its reset would run under a's decode still on the device.
    assert engine.open("b") != slot_a
    with pytest.raises(engine_mod.CodecAdmissionError):
        engine.open("c")
    held_events[-1].finished = True
    assert engine.step() == []  # a's audio is dropped: it was cancelled
    assert engine.open("c") == slot_a


def test_a_decode_that_never_finishes_stops_the_stage_as_a_device_failure(
    model: Qwen3TokenizerDecoder, held_events: list[RunningDecode]
) -> None:
    engine = one_decode_running(model, seed=63)
    assert not engine.has_work()  # running: polled, not yet stuck
    engine.urgent.inflight[0].launched_at -= lanes_mod.STALL_S + 1
    with pytest.raises(DeviceStalled, match="urgent lane's decode of 1 row") as err:
        engine.has_work()
    assert is_device_error(err.value)  # the engine thread ends the stage for supervision to restart it
    held_events[-1].finished = True
    assert engine.has_work()  # once it finishes it is collected as usual


def test_lanes_need_async_scheduling_and_a_budget(model: Qwen3TokenizerDecoder) -> None:
    pool = StreamingDecoder(model, 4)
    common = {"max_streams": 2, "schedule": ChunkSchedule(1, 25), "num_groups": GROUPS, "urgent_calls": None}
    with pytest.raises(ValueError, match="need async scheduling"):
        LanedCodecEngine(pool, urgent_budget_s=0.01, **common)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="urgent_budget_s must be > 0"):
        LanedCodecEngine(pool, urgent_budget_s=0, async_scheduling=True, **common)  # type: ignore[arg-type]


def test_the_warm_up_waits_for_both_lanes(model: Qwen3TokenizerDecoder) -> None:
    # The worker's warm-up decodes a short stream to its end; with lanes, has_work() is false while a decode
    # runs, so it must not stop there (run_until_idle sleeps the engine's idle_timeout instead).
    engine, _, urgent = laned(model, streams=2, policy="fifo")  # fifo off a GPU: no cost table to measure
    runtime = SimpleNamespace(num_groups=GROUPS, voice_clone=False)  # what the warm-up reads of it
    worker = CodecWorker(runtime, engine)  # type: ignore[arg-type]

    async def warm() -> float:
        worker.start(asyncio.get_running_loop())
        try:
            return await worker.warm_up()
        finally:
            worker.stop()

    assert asyncio.run(warm()) > 0
    assert engine.active() == 0 and not engine._in_flight_groups() and urgent.shapes


def test_a_lane_counts_ticks_not_calls_and_a_failed_launch_takes_no_room(
    model: Qwen3TokenizerDecoder, held_events: list[RunningDecode]
) -> None:
    engine, bulk, _ = laned(model, streams=4, policy="fifo")
    for sid, n in (("a", 25), ("b", 50)):  # first chunks past: a steady chunk, and a stream 2 chunks behind
        engine.open(sid, initial_frames=25)
        engine.push(sid, codes_for(70 + n, 25))
        engine.step()
        held_events[-1].finished = True
        engine.step()
    engine.push("a", codes_for(80, 25))
    engine.push("b", codes_for(81, 50))
    engine.step()  # one fifo tick of two calls (25- and 50-frame buckets): one of the lane's two ticks
    assert bulk.shapes[-2:] == [(1, 25), (1, 50)] and list(engine.bulk.ticks) == [2]
    assert engine.bulk.has_room()
    boom = RuntimeError("decode failed")
    engine.bulk.calls = engine.calls = FailingCalls(boom)  # type: ignore[assignment]
    engine.open("c", initial_frames=25)
    engine.push("c", codes_for(82, 25))
    engine.step()  # c's first chunk: the urgent lane
    held_events[-1].finished = True
    engine.step()
    engine.push("c", codes_for(83, 25))
    with pytest.raises(RuntimeError, match="decode failed"):
        engine.step()
    ended, _ = engine.recover(boom)
    assert ended == ["c"] and list(engine.bulk.ticks) == [2]  # the failed tick holds no room
    for event in held_events:
        event.finished = True
    outs = engine.step()
    assert sorted((o.stream_id, o.frames) for o in outs) == [("a", 25), ("b", 50)]


class FailingCalls(DecodeCalls):
    def __init__(self, exc: Exception) -> None:
        super().__init__(lambda codes, slots, lengths: codes)
        self.exc = exc

    def __call__(self, codes: torch.Tensor, slots: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        raise self.exc


def test_voice_clone_prefixes_and_kept_voice_states_give_one_lanes_audio(
    model: Qwen3TokenizerDecoder,
) -> None:
    # A reference prefix decodes on the urgent lane (its stream has no audio out yet) and its state is kept
    # for the voice at its collect; the next stream of that voice opens from it and decodes no prefix.
    from services.codec.engine import CodecEngine
    from services.codec.voice_states import VoiceStateCache

    prefix, gens = codes_for(90, 130), [codes_for(91, 45), codes_for(92, 45)]

    def speak(engine: CodecEngine) -> list[np.ndarray]:
        pcm = []
        for i, gen in enumerate(gens):
            engine.open(f"s{i}", prefix=prefix, prefix_key="narrator@1")
            engine.push(f"s{i}", gen)
            engine.finish(f"s{i}")
            got: dict[str, list[CodecOutput]] = {}
            run_until_idle(engine, lambda outputs, got=got: collect(outputs, got))
            pcm.append(np.concatenate([o.pcm for o in got[f"s{i}"]]))
        return pcm

    states = VoiceStateCache(1 << 30, 4)
    pool = StreamingDecoder(model, 4)
    two = LanedCodecEngine(
        pool, max_streams=2, schedule=ChunkSchedule(1, 25), num_groups=GROUPS, frame_buckets=BUCKETS,
        urgent_calls=None, urgent_budget_s=10 * MS, async_scheduling=True, tick_policy="deadline",
        tick_budget_s=60 * MS, cost=h200_like(2), voice_states=states,
    )  # fmt: skip
    one = CodecEngine(
        StreamingDecoder(model, 4), max_streams=2, schedule=ChunkSchedule(1, 25), num_groups=GROUPS,
        frame_buckets=BUCKETS, async_scheduling=True, voice_states=VoiceStateCache(1 << 30, 4),
    )  # fmt: skip
    laned_pcm, one_pcm = speak(two), speak(one)
    assert len(states) == 1  # the voice's state was kept once, after the first stream's prefix
    for a, b in zip(laned_pcm, one_pcm, strict=True):
        assert a.size == 45 * 1920
        np.testing.assert_allclose(a, b, atol=TOL, rtol=0)


def test_only_the_first_chunk_and_the_ramps_count_as_ramping() -> None:
    """What the urgent lane takes from a playing stream: the chunks the schedule makes shorter than a steady
    one, not a short last chunk (the lane's budget is for chunks due within the audio before them)."""
    ramped = ChunkSchedule(1, 25)
    assert [ramped.ramping(n, 1) for n in (0, 1, 2, 4, 8, 16)] == [True] * 6
    assert [ramped.ramping(n, 1) for n in (32, 57, 82)] == [False] * 3
    flat = ChunkSchedule(4, 25, ramp=False)
    assert flat.ramping(0, 4) and not flat.ramping(4, 4) and not flat.ramping(29, 4)
