"""The codec engine under ``codec_tick_policy: deadline`` on the real tiny decoder: the audio still equals the
offline decode, every tick keeps to its budget, a young stream's next chunk goes before bulk work, and the
start-up calibration measures the engine's own calls without touching any stream's state.

The cost model here is a given table (the H200's shape, services/codec/decode_cost.py), so which rows a tick
takes does not depend on this machine's speed; ``test_calibration_*`` times the real calls."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from services.codec.decode_cost import DecodeCost
from services.codec.engine import ChunkSchedule, CodecEngine, CodecOutput
from services.codec.models.qwen3_tts.decoder import Qwen3TokenizerDecoder
from services.codec.models.qwen3_tts.loader import random_init
from services.codec.models.qwen3_tts.presets import decoder_preset
from services.codec.models.qwen3_tts.streaming import StreamingDecoder
from tests.unit.codec.test_engine import GROUPS, TOL, codes_for, collect, feed, offline

MS = 1e-3
BUCKETS = (1, 2, 4, 8, 16, 25)


# (start tick, frames, frames pushed per tick) of 6 streams: producers faster and slower than the schedule.
SIX_STREAMS = {
    "a": (0, 60, 9),
    "b": (0, 53, 25),
    "c": (1, 27, 1),
    "d": (2, 51, 30),
    "e": (4, 9, 9),
    "f": (6, 40, 4),
}


def six_streams_codes() -> dict[str, np.ndarray]:
    return {sid: codes_for(50 + i, n) for i, (sid, (_, n, _)) in enumerate(SIX_STREAMS.items())}


def h200_like(streams: int) -> DecodeCost:
    return DecodeCost({(b, t): 2.4 * MS + 0.066 * MS * b * t for b in (1, 2, 4, 8, 16) for t in BUCKETS})


@pytest.fixture(scope="module")
def model() -> Qwen3TokenizerDecoder:
    return random_init(decoder_preset("qwen3-tts-tiny"), seed=0)


def deadline_engine(
    model: Qwen3TokenizerDecoder, streams: int, budget_ms: float, async_scheduling: bool = False
) -> CodecEngine:
    return CodecEngine(
        StreamingDecoder(model, 2 * streams), max_streams=streams, schedule=ChunkSchedule(1, 25),
        num_groups=GROUPS, frame_buckets=BUCKETS, async_scheduling=async_scheduling,
        tick_policy="deadline", tick_budget_s=budget_ms * MS, cost=h200_like(streams),
    )  # fmt: skip


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_split_ticks_still_equal_the_offline_decode(
    model: Qwen3TokenizerDecoder, async_scheduling: bool
) -> None:
    # A budget of about two 25-frame rows a tick.
    plan, codes = SIX_STREAMS, six_streams_codes()
    engine = deadline_engine(model, streams=6, budget_ms=10, async_scheduling=async_scheduling)
    single = max(engine.cost(1, t) for t in BUCKETS)  # type: ignore[misc]
    out: dict[str, list[CodecOutput]] = {}
    fed = dict.fromkeys(plan, 0)
    planned = []
    for tick in range(300):
        feed(engine, plan, codes, fed, tick)
        engine.planned_s = 0.0
        collect(engine.step(), out)
        planned.append(engine.planned_s)
        if all(fed[s] == plan[s][1] for s in plan) and not engine.has_work():
            break
    assert engine.active() == 0
    assert max(planned) <= max(10 * MS, single) and sum(p > 0 for p in planned) > 4
    for sid, (_, frames, _) in plan.items():
        outs = out[sid]
        assert outs[-1].final and sum(o.frames for o in outs) == frames
        assert [o.sample_offset for o in outs] == np.cumsum([0] + [o.pcm.size for o in outs[:-1]]).tolist()
        np.testing.assert_allclose(
            np.concatenate([o.pcm for o in outs]), offline(model, codes[sid]), atol=TOL, rtol=0
        )


def test_a_young_streams_chunk_goes_before_bulk_work(model: Qwen3TokenizerDecoder) -> None:
    engine = deadline_engine(model, streams=8, budget_ms=12)
    old = {f"old{i}": codes_for(60 + i, 75) for i in range(6)}
    for sid, c in old.items():
        engine.open(sid, initial_frames=25)
        engine.push(sid, c[:25])
    got: dict[str, list[CodecOutput]] = {}
    while engine.has_work():
        collect(engine.step(), got)
    assert all(got[sid][0].frames == 25 for sid in old)  # 2 s of audio out each: their players are fed
    for sid, c in old.items():
        engine.push(sid, c[25:50])
    young = codes_for(70, 2)
    engine.open("young")
    engine.push("young", young[:1])
    first = engine.step()
    # The young stream's first chunk leaves in the first tick; the bulk is spread over later ones.
    assert "young" in [o.stream_id for o in first]
    assert 0 < sum(o.stream_id.startswith("old") for o in first) < 6
    engine.push("young", young[1:])
    second = engine.step()
    assert "young" in [o.stream_id for o in second]  # its next chunk too, ahead of the old ones still due
    collect(first, got)
    collect(second, got)
    while engine.has_work():
        collect(engine.step(), got)
    for sid in old:
        assert sum(o.frames for o in got[sid]) == 50


def test_calibration_times_the_engines_calls_and_moves_no_state(model: Qwen3TokenizerDecoder) -> None:
    engine = CodecEngine(
        StreamingDecoder(model, 8), max_streams=4, schedule=ChunkSchedule(1, 25), num_groups=GROUPS,
        tick_policy="deadline", tick_budget_s=1e-4,
    )  # fmt: skip
    engine.open("s")
    engine.push("s", codes_for(80, 3))
    engine.step()
    pool = engine.codec.pool.clone()  # type: ignore[attr-defined]
    positions = engine.codec.positions.clone()  # type: ignore[attr-defined]
    cost = engine.calibrate(repeats=1)
    assert engine.cost is cost
    # Eager (no frame buckets): the schedule's chunk sizes and the 100-frame catch-up, each from one row up
    # until a call passes twice the budget (here at once: a tiny budget keeps the test short).
    assert set(cost.table) == {(1, t) for t in (1, 2, 4, 8, 16, 25, 100)}
    assert all(s > 0 for s in cost.table.values())
    assert torch.equal(engine.codec.pool, pool) and torch.equal(engine.codec.positions, positions)  # type: ignore[attr-defined]


def test_bad_policy_settings_are_refused(model: Qwen3TokenizerDecoder) -> None:
    pool = StreamingDecoder(model, 2)
    with pytest.raises(ValueError, match="tick_policy must be one of fifo, deadline"):
        CodecEngine(pool, max_streams=1, schedule=ChunkSchedule(1, 25), num_groups=GROUPS, tick_policy="edf")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="tick_budget_s must be > 0"):
        CodecEngine(pool, max_streams=1, schedule=ChunkSchedule(1, 25), num_groups=GROUPS, tick_budget_s=0)


def test_async_ticks_launch_before_the_previous_one_is_collected(
    model: Qwen3TokenizerDecoder, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The device must go from one bounded tick straight into the next: a step launches its tick, then waits
    # for the previous one. Read-backs are events that log when they are waited on (CPU decodes are done
    # before they return, so the order of the log is the order of the engine's calls).
    from services.codec import engine as engine_mod

    order: list[str] = []
    real_read_back = engine_mod.read_back

    class LoggedEvent:
        def __init__(self, name: str) -> None:
            self.name = name

        def query(self) -> bool:
            return False

        def synchronize(self) -> None:
            order.append(f"collect {self.name}")

    def read_back(wav: torch.Tensor) -> tuple[torch.Tensor, LoggedEvent]:
        pcm, _ = real_read_back(wav)
        order.append(f"launch {len(order)}")
        return pcm, LoggedEvent(order[-1].split()[1])

    monkeypatch.setattr(engine_mod, "read_back", read_back)
    engine = deadline_engine(model, streams=2, budget_ms=1000, async_scheduling=True)
    codes = {"a": codes_for(90, 3), "b": codes_for(91, 3)}
    got: dict[str, list[CodecOutput]] = {}
    engine.open("a")
    engine.push("a", codes["a"])
    engine.finish("a")
    collect(engine.step(), got)  # launches a's first chunk
    engine.open("b")
    engine.push("b", codes["b"])
    engine.finish("b")
    collect(engine.step(), got)  # launches b's first chunk, then collects a's
    assert order == ["launch 0", "launch 1", "collect 0"] and [o.stream_id for o in got["a"]] == ["a"]
    while engine.has_work():
        collect(engine.step(), got)
    for sid, c in codes.items():
        assert sum(o.frames for o in got[sid]) == 3 and got[sid][-1].final
        np.testing.assert_allclose(
            np.concatenate([o.pcm for o in got[sid]]), offline(model, c), atol=TOL, rtol=0
        )


def test_a_chunk_far_ahead_of_its_player_waits_no_longer_than_the_bound(
    model: Qwen3TokenizerDecoder,
) -> None:
    # On the H200 a stream seconds ahead of its listener had its last chunk put off past the gateway's 3 s
    # stall timeout while younger streams kept coming: a ready chunk is now due max_wait_s after it is ready.
    engine = CodecEngine(
        StreamingDecoder(model, 4), max_streams=2, schedule=ChunkSchedule(1, 25), num_groups=GROUPS,
        frame_buckets=BUCKETS, tick_policy="deadline", tick_budget_s=1 * MS, cost=h200_like(2),
        max_wait_s=0.5,
    )  # fmt: skip
    engine.open("far", initial_frames=25)
    engine.push("far", codes_for(80, 25))
    got: dict[str, list[CodecOutput]] = {}
    while engine.has_work():
        collect(engine.step(), got)
    far = engine._streams["far"]
    far.first_audio_at = time.perf_counter()
    far.sample_offset = 100 * engine.sample_rate  # its listener holds 100 s: its player runs dry much later
    engine.push("far", codes_for(81, 25))
    engine.open("young")
    engine.push("young", codes_for(82, 1))
    first = engine.step()  # a 1 ms budget takes one row a tick: the young stream's, due since it opened
    assert [o.stream_id for o in first] == ["young"] and far.ready_since is not None
    assert engine._deadline(far, time.perf_counter()) == pytest.approx(far.ready_since + 0.5)  # not 100 s
    far.ready_since -= 1.0  # it has waited past the bound: it now goes before the young stream's next chunk
    engine.push("young", codes_for(83, 1))
    assert [o.stream_id for o in engine.step()] == ["far"]
    assert far.ready_since is None  # its decode launched: the clock starts again with its next ready chunk
    with pytest.raises(ValueError, match="max_wait_s"):
        CodecEngine(StreamingDecoder(model, 4), max_streams=2, schedule=ChunkSchedule(1, 25),
                    num_groups=GROUPS, max_wait_s=0)  # fmt: skip


@pytest.mark.parametrize("policy", ["deadline", "fifo"])
def test_a_ramp_chunk_follows_its_streams_decode_in_flight(model: Qwen3TokenizerDecoder, policy: str) -> None:
    # Async deadline ticks launch before they collect, so a stream is still in flight when the next tick is
    # planned; its next ramp chunk goes in that tick anyway, one tick after the last (it went two ticks after
    # before: a young stream's second chunk is due 80 ms after its first audio). fifo collects first.
    engine = deadline_engine(model, streams=2, budget_ms=1000, async_scheduling=True)
    if policy == "fifo":
        engine.tick_policy = "fifo"
    codes = codes_for(93, 40)
    engine.open("a")
    engine.push("a", codes[:8])  # the ramp's first chunks: 1, 1, 2, 4 frames
    got: dict[str, list[CodecOutput]] = {}
    per_step = []
    for _ in range(5):
        outs = engine.step()
        per_step.append([o.frames for o in outs])
        collect(outs, got)
    assert per_step == [[], [1], [1], [2], [4]]
    engine.push("a", codes[8:])
    engine.finish("a")
    while engine.has_work():
        collect(engine.step(), got)
    outs = got["a"]
    assert outs[-1].final and sum(o.frames for o in outs) == 40 and engine.active() == 0
    assert [o.frames for o in outs[:5]] == [1, 1, 2, 4, 8]
    np.testing.assert_allclose(np.concatenate([o.pcm for o in outs]), offline(model, codes), atol=TOL, rtol=0)


def test_end_and_cancel_with_two_decodes_in_flight(model: Qwen3TokenizerDecoder) -> None:
    engine = deadline_engine(model, streams=2, budget_ms=1000, async_scheduling=True)
    codes = {"a": codes_for(94, 2), "b": codes_for(95, 8)}
    got: dict[str, list[CodecOutput]] = {}
    for sid, c in codes.items():
        engine.open(sid)
        engine.push(sid, c)
    collect(engine.step(), got)  # both first chunks launch
    collect(engine.step(), got)  # both second chunks follow them; the first ones come back
    engine.finish("a")  # its last frame is in flight: only the decode that carries it may be final
    engine.cancel("b")  # two decodes in flight: neither may hand out audio
    while engine.has_work():
        collect(engine.step(), got)
    assert [(o.frames, o.final) for o in got["a"]] == [(1, False), (1, True)]
    audio_a = np.concatenate([o.pcm for o in got["a"]])
    np.testing.assert_allclose(audio_a, offline(model, codes["a"]), atol=TOL)
    assert [o.frames for o in got["b"]] == [1] and engine.active() == 0
    engine.open("c")  # both slots are free again
    engine.open("d")


@pytest.mark.parametrize("first_chunks", ["lead", "yield"])
def test_where_streams_not_playing_yet_rank(model: Qwen3TokenizerDecoder, first_chunks: str) -> None:
    """Streams joining at once: a playing stream's second chunk is due 80 ms after its first audio. Under
    ``yield`` it goes before the first chunks of streams that are not playing yet (they cannot stall, only
    start later); under ``lead`` those first chunks go first. The budget takes four 1-frame rows a tick."""
    engine = CodecEngine(
        StreamingDecoder(model, 2 * 12), max_streams=12, schedule=ChunkSchedule(1, 25), num_groups=GROUPS,
        frame_buckets=BUCKETS, tick_policy="deadline", tick_budget_s=2.8 * MS, cost=h200_like(12),
        first_chunks=first_chunks,  # type: ignore[arg-type]
    )  # fmt: skip
    playing = [f"p{i}" for i in range(3)]
    for i, sid in enumerate(playing):
        engine.open(sid)
        engine.push(sid, codes_for(90 + i, 1))
    assert {o.stream_id for o in engine.step()} == set(playing)  # their first audio: the players start
    joining = [f"j{i}" for i in range(8)]
    for i, sid in enumerate(joining):
        engine.open(sid)
        engine.push(sid, codes_for(100 + i, 1))
    for i, sid in enumerate(playing):
        engine.push(sid, codes_for(120 + i, 1))  # the second chunk: due 80 ms after the first audio
    first = {o.stream_id for o in engine.step()}
    if first_chunks == "yield":  # no playing stream waits behind a stream that has not started
        assert first == {*playing, "j0"}
    else:  # the first chunks led, in the order their streams opened; the playing streams' chunks wait
        assert first == {"j0", "j1", "j2", "j3"}
    while engine.has_work():
        engine.step()
    assert engine.active() == len(playing) + len(joining)  # nothing dropped: every chunk went out


def test_first_chunks_takes_only_its_two_values(model: Qwen3TokenizerDecoder) -> None:
    with pytest.raises(ValueError, match="first_chunks must be one of lead, yield"):
        CodecEngine(
            StreamingDecoder(model, 4), max_streams=2, schedule=ChunkSchedule(1, 25), num_groups=GROUPS,
            first_chunks="soon",  # type: ignore[arg-type]
        )  # fmt: skip


def test_start_up_graphs_are_the_calls_a_bounded_tick_can_make(model: Qwen3TokenizerDecoder) -> None:
    from services.codec.graphs import GraphedDecode

    engine = deadline_engine(model, 16, budget_ms=10.0)  # 2.4 ms + 66 us a frame-row: 115 rows fit
    assert engine.plannable_call(4, 25) and not engine.plannable_call(8, 25)
    assert engine.plannable_call(1, 100)  # a row alone goes whatever it costs
    graphed = GraphedDecode(
        engine.codec, num_groups=GROUPS, max_batch=16, frame_buckets=BUCKETS, device="cpu", enabled=False
    )  # type: ignore[arg-type]
    order = graphed.capture_order(16 * 25, engine.plannable_call)
    assert (4, 25) in order and (8, 25) not in order and (16, 4) in order and (16, 8) not in order
    assert order == graphed.capture_order(16 * 25, lambda b, t: 2.4 + 0.066 * b * t <= 10.0 or b == 1)
    assert len(graphed.capture_order(16 * 25)) == 5 * len(BUCKETS)  # fifo's set: every bucket up to 16 x 25
    fifo = CodecEngine(
        StreamingDecoder(model, 32), max_streams=16, schedule=ChunkSchedule(1, 25), num_groups=GROUPS,
        frame_buckets=BUCKETS, tick_policy="fifo",
    )  # fmt: skip
    assert fifo.plannable_call(16, 25)  # one call takes every ready row
