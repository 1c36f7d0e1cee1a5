"""Codec engine on the real tiny decoder: batched streaming equals the offline decode, slots are recycled.

The seed schedule (first chunk 1 frame, then doubling up to 25) is what the deploy files give; streams
start at different ticks so every decode batch mixes first chunks, steady chunks and end-of-stream
remainders of different lengths in one padded call.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from services.codec.engine import ChunkSchedule, CodecAdmissionError, CodecEngine, CodecOutput
from services.codec.models.qwen3_tts.decoder import Qwen3TokenizerDecoder
from services.codec.models.qwen3_tts.loader import random_init
from services.codec.models.qwen3_tts.presets import decoder_preset
from services.codec.models.qwen3_tts.streaming import StreamingDecoder
from voxstage import metrics

TOL = 1e-5
SPF = 1920
GROUPS = 16
SEED_SCHEDULE = ChunkSchedule(initial_frames=1, steady_frames=25)


@pytest.fixture(scope="module")
def model() -> Qwen3TokenizerDecoder:
    return random_init(decoder_preset("qwen3-tts-tiny"), seed=0)


def make_engine(model: Qwen3TokenizerDecoder, streams: int, async_scheduling: bool = False) -> CodecEngine:
    return CodecEngine(
        StreamingDecoder(model, 2 * streams), max_streams=streams, schedule=SEED_SCHEDULE, num_groups=GROUPS,
        async_scheduling=async_scheduling,
    )  # fmt: skip


def codes_for(seed: int, frames: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 2048, size=(frames, GROUPS), dtype=np.int64)


def offline(model: Qwen3TokenizerDecoder, codes: np.ndarray) -> np.ndarray:
    with torch.inference_mode():
        return model(torch.from_numpy(codes.T.copy())[None])[0].numpy()


def feed(
    engine: CodecEngine,
    plan: dict[str, tuple[int, int, int]],
    codes: dict[str, np.ndarray],
    fed: dict[str, int],
    tick: int,
) -> None:
    """Tick ``tick`` of ``plan`` (per stream: the tick it opens, its frames, frames pushed a tick): open,
    push and finish as a talker would; ``fed`` counts each stream's frames pushed."""
    for sid, (start, frames, rate) in plan.items():
        if tick == start:
            engine.open(sid)
        if tick >= start and fed[sid] < frames:
            n = min(rate, frames - fed[sid])
            engine.push(sid, codes[sid][fed[sid] : fed[sid] + n])
            fed[sid] += n
            if fed[sid] == frames:
                engine.finish(sid)


def collect(outputs: list[CodecOutput], into: dict[str, list[CodecOutput]]) -> None:
    for o in outputs:
        into.setdefault(o.stream_id, []).append(o)


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_staggered_streams_equal_offline_decode(model: Qwen3TokenizerDecoder, async_scheduling: bool) -> None:
    # (start tick, frames, frames pushed per tick): producers faster and slower than the schedule.
    plan = {"a": (0, 60, 3), "b": (2, 27, 1), "c": (5, 51, 7), "d": (9, 1, 1)}
    codes = {sid: codes_for(i, frames) for i, (sid, (_, frames, _)) in enumerate(plan.items())}
    engine = make_engine(model, streams=4, async_scheduling=async_scheduling)
    out: dict[str, list[CodecOutput]] = {}
    fed = dict.fromkeys(plan, 0)
    for tick in range(200):
        feed(engine, plan, codes, fed, tick)
        collect(engine.step(), out)
        if all(fed[s] == plan[s][1] for s in plan) and not engine.has_work():
            break
    assert engine.active() == 0
    for sid, (_, frames, _) in plan.items():
        outs = out[sid]
        assert outs[-1].final and sum(o.final for o in outs) == 1
        # Offsets are contiguous and the first chunk follows the schedule's 1-frame first chunk.
        offsets = np.cumsum([0] + [o.pcm.size for o in outs[:-1]])
        assert [o.sample_offset for o in outs] == offsets.tolist()
        assert outs[0].frames == 1
        pcm = np.concatenate([o.pcm for o in outs])
        assert sum(o.frames for o in outs) == frames and pcm.size == frames * SPF
        ref = offline(model, codes[sid])
        assert ref.std() > 0.05  # not silence: a broken decode could not match by accident
        np.testing.assert_allclose(pcm, ref, atol=TOL, rtol=0)


def test_async_scheduling_hands_out_each_decode_one_step_later(model: Qwen3TokenizerDecoder) -> None:
    codes = codes_for(7, 30)
    runs = {}
    for flag in (False, True):
        engine = make_engine(model, streams=2, async_scheduling=flag)
        engine.open("s")
        engine.open("gone")
        engine.push("gone", codes[:5])
        ticks: list[list[CodecOutput]] = []
        for i in range(30):
            engine.push("s", codes[i : i + 1])
            if i == 29:
                engine.finish("s")
            ticks.append(engine.step())
            if i == 0:
                engine.cancel("gone")  # its first decode may still be in flight: dropped, not delivered
        while engine.has_work():
            ticks.append(engine.step())
        runs[flag] = ticks
    sizes = {f: [[o.frames for o in t if o.stream_id == "s"] for t in r] for f, r in runs.items()}
    sync, overlapped = sizes[False], sizes[True]
    assert sync[0] == [1] and not runs[True][0]
    # Every decode comes out of the step after the one that launched it, with the same audio.
    assert overlapped[1:] == sync[: len(overlapped) - 1] and not any(sync[len(overlapped) - 1 :])
    assert all(o.stream_id == "s" for t in runs[True] for o in t)  # the cancelled stream's decode is dropped
    pcm = {f: np.concatenate([o.pcm for t in r for o in t if o.stream_id == "s"]) for f, r in runs.items()}
    assert np.array_equal(pcm[False], pcm[True])
    np.testing.assert_allclose(pcm[True], offline(model, codes), atol=TOL, rtol=0)


def chunk_sizes_for_one_frame_per_tick(engine: CodecEngine, frames: int = 60) -> list[int]:
    engine.open("s")
    sizes: list[int] = []
    for i in range(frames):
        engine.push("s", codes_for(100 + i, 1))
        sizes += [o.frames for o in engine.step()]
    engine.finish("s")
    while engine.has_work():
        sizes += [o.frames for o in engine.step()]
    return sizes


def test_steady_chunks_follow_the_schedule(model: Qwen3TokenizerDecoder) -> None:
    sizes = chunk_sizes_for_one_frame_per_tick(make_engine(model, streams=1))
    # The ramp: each chunk as long as the audio before it, up to the steady 25, then the remainder.
    assert sizes == [1, 1, 2, 4, 8, 16, 25, 3]


def test_fixed_steady_chunks_without_the_ramp(model: Qwen3TokenizerDecoder) -> None:
    fixed = ChunkSchedule(1, 25, ramp=False)
    engine = CodecEngine(StreamingDecoder(model, 2), max_streams=1, schedule=fixed, num_groups=GROUPS)
    sizes = chunk_sizes_for_one_frame_per_tick(engine)
    assert sizes == [1, 25, 25, 9]


def decode_as_it_comes(engine: CodecEngine, codes: np.ndarray, per_step: int) -> tuple[list[int], np.ndarray]:
    """Frames pushed ``per_step`` at a time, a step after each push: (decode sizes, PCM)."""
    engine.open("s")
    outs: list[CodecOutput] = []
    for start in range(0, codes.shape[0], per_step):
        engine.push("s", codes[start : start + per_step])
        outs += engine.step()
    engine.finish("s")
    while engine.has_work():
        outs += engine.step()
    return [o.frames for o in outs], np.concatenate([o.pcm for o in outs])


def test_a_stream_behind_in_the_ramp_decodes_the_same_chunks_and_pcm(model: Qwen3TokenizerDecoder) -> None:
    # A codec busy elsewhere (a voice-clone prefix, other streams) finds several of a young stream's ramp
    # chunks buffered at once. Decoding them in one call gave PCM a bit off that of the same frames arriving
    # one chunk at a time, so one request's audio depended on timing (tests/integration/test_voice_library).
    codes = codes_for(5, 40)
    trickled = decode_as_it_comes(make_engine(model, streams=1), codes, per_step=1)
    burst = decode_as_it_comes(make_engine(model, streams=1), codes, per_step=40)
    assert trickled[0] == burst[0] == [1, 1, 2, 4, 8, 16, 8]
    assert np.array_equal(trickled[1], burst[1])


def test_cancel_frees_the_slot_and_reuse_starts_from_clean_state(model: Qwen3TokenizerDecoder) -> None:
    engine = make_engine(model, streams=1)
    engine.open("x")
    engine.push("x", codes_for(7, 30))
    engine.step()
    assert engine.active() == 1
    with pytest.raises(CodecAdmissionError):
        engine.open("y")
    assert engine.cancel("x") and not engine.cancel("x")
    assert engine.active() == 0
    # The reused slot must not carry x's history: y decodes exactly like a fresh offline pass.
    fresh = codes_for(8, 26)
    engine.open("y")
    engine.push("y", fresh)
    engine.finish("y")
    out: dict[str, list[CodecOutput]] = {}
    while engine.has_work():
        collect(engine.step(), out)
    pcm = np.concatenate([o.pcm for o in out["y"]])
    np.testing.assert_allclose(pcm, offline(model, fresh), atol=TOL, rtol=0)


def test_slot_gauges_give_the_occupancy_ratio(model: Qwen3TokenizerDecoder) -> None:
    # The codec's autoscaler divides slots_in_use by slots (deploy/k8s/components/autoscaling): both must
    # be exported, and slots must be the engine's capacity, not its current use.
    def sample(name: str) -> float | None:
        return metrics.REGISTRY.get_sample_value(name, {"stage": "codec"})

    metrics.SLOTS_TOTAL.labels(stage="codec").set(0)  # whatever an earlier test left there
    engine = make_engine(model, streams=3)
    assert sample("voxstage_slots") == 3
    engine.open("a")
    engine.open("b")
    assert sample("voxstage_slots_in_use") == 2 and sample("voxstage_slots") == 3
    engine.cancel("a")
    assert sample("voxstage_slots_in_use") == 1 and sample("voxstage_slots") == 3


def test_prefix_warms_state_and_its_audio_is_dropped(model: Qwen3TokenizerDecoder) -> None:
    engine = make_engine(model, streams=1)
    ref, gen = codes_for(20, 12), codes_for(21, 30)
    engine.open("icl", prefix=ref)
    engine.push("icl", gen)
    engine.finish("icl")
    out: dict[str, list[CodecOutput]] = {}
    while engine.has_work():
        collect(engine.step(), out)
    pcm = np.concatenate([o.pcm for o in out["icl"]])
    whole = offline(model, np.concatenate([ref, gen]))
    assert out["icl"][0].sample_offset == 0 and sum(o.frames for o in out["icl"]) == 30
    np.testing.assert_allclose(pcm, whole[12 * SPF :], atol=TOL, rtol=0)


def test_many_open_close_cycles_leave_the_pool_unchanged(model: Qwen3TokenizerDecoder) -> None:
    engine = make_engine(model, streams=3)
    free_before = sorted(engine._free)
    pool_shape = engine.codec.pool.shape  # type: ignore[attr-defined]
    one = codes_for(30, 1)
    for i in range(3000):
        sid = f"s{i}"
        engine.open(sid)
        if i % 3 == 0:
            engine.cancel(sid)
        elif i % 3 == 1:
            engine.finish(sid)  # ended with nothing buffered: a terminal output and the slot back
            assert [o.final for o in engine.step()] == [True]
        else:
            engine.push(sid, one)
            engine.cancel(sid)
    assert engine.active() == 0 and not engine.has_work()
    assert sorted(engine._free) == free_before
    assert engine.codec.pool.shape == pool_shape  # type: ignore[attr-defined]
    # A stream after all that still decodes exactly.
    fresh = codes_for(31, 5)
    engine.open("last")
    engine.push("last", fresh)
    engine.finish("last")
    out: dict[str, list[CodecOutput]] = {}
    while engine.has_work():
        collect(engine.step(), out)
    np.testing.assert_allclose(
        np.concatenate([o.pcm for o in out["last"]]), offline(model, fresh), atol=TOL, rtol=0
    )


def test_bad_codes_are_rejected_before_they_reach_the_decoder(model: Qwen3TokenizerDecoder) -> None:
    engine = make_engine(model, streams=1)
    engine.open("s")
    with pytest.raises(ValueError, match=r"\[frames, 16\]"):
        engine.push("s", np.zeros((3, 8), np.int64))
    with pytest.raises(KeyError, match="no open codec stream"):
        engine.push("nope", codes_for(1, 1))
    engine.finish("s")
    with pytest.raises(ValueError, match="already ended"):
        engine.push("s", codes_for(1, 1))


def test_a_tick_decodes_once_per_frame_bucket_with_capped_batches(model: Qwen3TokenizerDecoder) -> None:
    pool = StreamingDecoder(model, 6)
    calls: list[tuple[int, int]] = []

    def decode(codes: torch.Tensor, slots: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        calls.append((codes.shape[0], codes.shape[2]))
        return pool.decode(codes, slots, lengths)

    engine = CodecEngine(
        pool,
        max_streams=3,
        schedule=ChunkSchedule(1, 25, ramp=False),  # fixed 25-frame chunks keep the tick arithmetic plain
        num_groups=GROUPS,
        decode_fn=decode,
        frame_buckets=(1, 25),
    )
    codes = {sid: codes_for(40 + i, 27 if sid == "a" else 26) for i, sid in enumerate("abc")}
    out: dict[str, list[CodecOutput]] = {}
    for sid in "abc":
        engine.open(sid)
        engine.push(sid, codes[sid][:1])
    collect(engine.step(), out)  # three 1-frame first chunks: a batch of 3 (max_streams), not 4
    engine.push("a", codes["a"][1:])
    for sid in "bc":
        engine.push(sid, codes[sid][1:2])
    collect(engine.step(), out)  # a: 25 steady frames; b, c: 1 frame each, not yet a steady chunk
    engine.push("b", codes["b"][2:])
    engine.push("c", codes["c"][2:])
    for sid in "abc":
        engine.finish(sid)
    collect(engine.step(), out)  # a: its 1-frame remainder; b, c: 25 frames each -> two calls, not (3, 25)
    while engine.has_work():
        collect(engine.step(), out)
    assert calls[:3] == [(3, 1), (1, 25), (1, 1)] and calls[3] == (2, 25)
    for sid in "abc":
        pcm = np.concatenate([o.pcm for o in out[sid]])
        np.testing.assert_allclose(pcm, offline(model, codes[sid]), atol=TOL, rtol=0)


def test_start_up_capture_covers_every_batch_the_engine_pads_to() -> None:
    from services.codec.engine import batch_bucket
    from services.codec.graphs import GraphedDecode

    model = random_init(decoder_preset("qwen3-tts-tiny"), 0)
    graphed = GraphedDecode(
        StreamingDecoder(model, 640), num_groups=16, max_batch=320, frame_buckets=(25, 1), device="cpu",
        enabled=False,
    )  # fmt: skip
    assert graphed.batch_buckets() == [1, 2, 4, 8, 16, 32, 64, 128, 256, 320]
    assert {batch_bucket(n, 320) for n in range(1, 321)} == set(graphed.batch_buckets())
    assert graphed.capture_all() == 0  # CPU: nothing to capture, every call runs eagerly
    order = graphed.capture_order(max_frames=256 * 25)
    assert len(order) == 10 + 9  # every batch bucket at 1 frame; at 25 frames up to 256 x 25 = 6,400 rows
    assert order[0] == (256, 25) and order[-1] == (1, 1)  # largest first: later captures reuse its blocks
    assert [b * t for b, t in order] == sorted((b * t for b, t in order), reverse=True)


class HeldEvent:
    """Stands in for a CUDA event of a decode still running (CPU decodes finish before they return)."""

    def __init__(self) -> None:
        self.released = False

    def query(self) -> bool:
        return self.released

    def synchronize(self) -> None:
        self.released = True


def young_behind_bulk(
    model: Qwen3TokenizerDecoder, monkeypatch: pytest.MonkeyPatch, *, early_handout: bool
) -> tuple[CodecEngine, list[HeldEvent], np.ndarray]:
    """An async engine whose last step launched a young stream's 1-frame first chunk and, behind it, an old
    stream's 25-frame decode that stays "running" until someone waits on it; old has its next chunk in."""
    from services.codec import engine as engine_mod

    held: list[HeldEvent] = []
    real_read_back = engine_mod.read_back

    def read_back(wav: torch.Tensor) -> tuple[torch.Tensor, HeldEvent | None]:
        pcm, _ = real_read_back(wav)
        if wav.shape[-1] >= 25 * SPF:  # the bulk bucket: "still decoding" until someone waits on it
            held.append(HeldEvent())
            return pcm, held[-1]  # type: ignore[return-value]
        return pcm, None

    monkeypatch.setattr(engine_mod, "read_back", read_back)
    engine = make_engine(model, streams=2, async_scheduling=True)
    engine.early_handout = early_handout
    old, young = codes_for(1, 60), codes_for(2, 1)
    engine.open("old", initial_frames=25)
    engine.push("old", old[:25])
    engine.open("young")
    engine.push("young", young)
    assert engine.step() == []  # both launched: young's 1-frame bucket first, then old's 25-frame one
    engine.push("old", old[25:50])
    return engine, held, old


def test_async_step_hands_out_a_young_chunk_without_waiting_for_a_bulk_decode(
    model: Qwen3TokenizerDecoder, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine, held, old = young_behind_bulk(model, monkeypatch, early_handout=True)
    got: dict[str, list[CodecOutput]] = {}
    out = engine.step()
    collect(out, got)
    # young's audio leaves now, while old's decode is still "running"; old, with a whole chunk buffered, is
    # not launched again until that decode is collected (one held event, not two).
    assert [(o.stream_id, o.frames) for o in out] == [("young", 1)]
    assert len(held) == 1 and not held[0].released and engine.has_work()
    out = engine.step()  # nothing else in hand: this one waits for old's decode, then launches its next
    collect(out, got)
    assert [(o.stream_id, o.frames) for o in out] == [("old", 25)] and held[0].released and len(held) == 2
    engine.finish("young")
    engine.push("old", old[50:])
    engine.finish("old")
    while engine.has_work():
        collect(engine.step(), got)
    assert engine.active() == 0 and got["young"][-1].final and got["old"][-1].final
    pcm = np.concatenate([o.pcm for o in got["old"]])
    np.testing.assert_allclose(pcm, offline(model, old), atol=TOL, rtol=0)


def test_without_early_handout_the_async_step_waits_for_the_bulk_decode(
    model: Qwen3TokenizerDecoder, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The benchmarks' switch (bench/codec_schedule.py) off: young's chunk leaves only with old's, read back.
    engine, held, _ = young_behind_bulk(model, monkeypatch, early_handout=False)
    out = engine.step()
    assert [(o.stream_id, o.frames) for o in out] == [("young", 1), ("old", 25)]
    assert held[0].released and len(held) == 2  # waited on, and old's next chunk already launched
