"""Duplex codec engine on the tiny preset's Mimi (CPU), driven by an injected clock (no sleeps).

Each session's user codes and agent PCM are compared with the same audio run alone through a fresh slot
pool, so batching, staggered joins, leaves (the last session moving into the hole) and silence fill are all
checked against the solo run.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from codec_duplex_kit import (
    SPF,
    Clock,
    CountingCalls,
    EngineRig,
    agent_codes,
    answer,
    make_rig,
    solo_decode,
    solo_encode,
    speech,
)

from services.codec.duplex.calls import PackedCalls
from services.codec.duplex.engine import DuplexCodecEngine
from services.codec.duplex.graphs import GraphedDuplexCalls
from services.codec.duplex.types import AgentFrame, DuplexCodecConfig
from services.codec.models.mimi.loader import random_init
from services.codec.models.mimi.loudness import integrated_loudness
from services.codec.models.mimi.model import MimiModel
from services.codec.models.mimi.presets import tiny_config
from services.codec.models.mimi.recording import prepare_reference
from services.codec.models.mimi.streaming import MimiStreamingCodec
from voxstage import metrics
from voxstage.duplex import DuplexAdmissionError

K = 8
TICK = 0.08
TOL = 1e-5


@pytest.fixture(scope="module")
def model() -> MimiModel:
    return random_init(tiny_config(), seed=5)


def test_silence_fill_counts_an_underflow_and_encodes_zeros(model: MimiModel) -> None:
    rig = make_rig(model, sessions=2)
    before = metrics.DUPLEX_INPUT_UNDERFLOW._value.get()
    rig.engine.join("a")
    rig.engine.start("a")
    assert not rig.engine.has_work() and rig.engine.idle_timeout() == pytest.approx(TICK)
    rig.tick()
    rig.engine.push_audio("a", speech(1, 1), 0)
    rig.tick()
    rig.tick()  # nothing arrived for this one either
    (first, second, third) = rig.user["a"]
    assert [u.source_frame for u in rig.user["a"]] == [-1, 0, -1]
    assert [u.index for u in rig.user["a"]] == [0, 1, 2]
    assert [u.freed_samples for u in rig.user["a"]] == [0, SPF, 0]
    assert rig.engine.info("a").underflows == 2
    assert metrics.DUPLEX_INPUT_UNDERFLOW._value.get() - before == 2
    fed = np.concatenate([np.zeros(SPF, np.float32), speech(1, 1), np.zeros(SPF, np.float32)])
    np.testing.assert_array_equal(np.stack([u.codes for u in rig.user["a"]]), solo_encode(model, fed))


def test_one_encode_per_tick_and_one_decode_per_burst(model: MimiModel) -> None:
    rig = make_rig(model, sessions=4)
    for sid in "abc":
        rig.engine.join(sid)
        rig.engine.start(sid)
        rig.engine.push_audio(sid, speech(ord(sid), 2), 0)
    rig.tick()
    assert rig.calls.encodes == [[1, 1, 1, 0]]  # three sessions, batch bucket 4, the padding row idle
    codes = agent_codes(0, 2)
    answer(rig, "a", codes, 1)
    answer(rig, "b", codes, 1)
    assert not rig.engine.has_work()  # c has not answered: gather
    assert rig.engine.idle_timeout() == pytest.approx(0.005)
    answer(rig, "c", codes, 1)
    assert rig.engine.has_work()  # everyone answered: decode now, without waiting out the gather
    rig.run(rig.clock.now)
    assert rig.calls.decodes == [[1, 1, 1, 0]]
    assert sorted(rig.agent) == ["a", "b", "c"]
    # A straggler is decoded once the gather window has passed.
    rig.tick()
    answer(rig, "a", codes, 0)
    rig.run(rig.clock.now + 0.004)
    assert len(rig.calls.decodes) == 1
    rig.run(rig.clock.now + 0.002)
    assert rig.calls.decodes[-1] == [1, 0, 0, 0]


def test_join_leave_and_packed_moves_keep_every_session_equal_to_its_solo_run(model: MimiModel) -> None:
    rig = make_rig(model, sessions=4)
    frames = 12
    plan = {"a": 0, "b": 2, "c": 3, "d": 5}  # join tick
    leave_at = {"b": 7}  # b leaves mid-call: d (the last slot) moves into its hole
    pcm = {sid: speech(10 + i, frames) for i, sid in enumerate(plan)}
    codes = {sid: agent_codes(20 + i, frames + 8) for i, sid in enumerate(plan)}
    fed: dict[str, list[np.ndarray]] = {sid: [] for sid in plan}
    for tick in range(frames + 6):
        for sid, start in plan.items():
            if tick == start:
                rig.engine.join(sid)
                rig.engine.start(sid)
            if leave_at.get(sid) == tick:
                rig.engine.leave(sid)
        live = [sid for sid in plan if plan[sid] <= tick and tick < leave_at.get(sid, 99)]
        for sid in live:
            n = tick - plan[sid]
            if n < frames and n % 4 != 3:  # every fourth frame is late: it arrives after its tick
                rig.engine.push_audio(sid, pcm[sid][n * SPF : (n + 1) * SPF], n * SPF)
        rig.tick()
        for sid in live:
            n = tick - plan[sid]
            if n < frames and n % 4 == 3:
                rig.engine.push_audio(sid, pcm[sid][n * SPF : (n + 1) * SPF], n * SPF)
            got = rig.user[sid][-1]
            fed[sid].append(
                np.zeros(SPF, np.float32)
                if got.source_frame < 0
                else pcm[sid][got.source_frame * SPF : (got.source_frame + 1) * SPF]
            )
            answer(rig, sid, codes[sid], got.index + 1)
        rig.run(rig.clock.now + 0.001)
    assert rig.engine.info("d").slot == 1  # moved into b's hole
    for sid in plan:
        user = rig.user[sid]
        np.testing.assert_array_equal(
            np.stack([u.codes for u in user]), solo_encode(model, np.concatenate(fed[sid]))
        )
        # Late audio is the next frame, never replayed out of order: sources ascend, gaps are silence.
        sources = [u.source_frame for u in user if u.source_frame >= 0]
        assert sources == sorted(sources) == list(range(len(sources)))
        agent = rig.agent[sid]
        assert [a.frame for a in agent] == list(range(1, len(agent) + 1))
        pcm_out = np.concatenate([a.pcm for a in agent])
        ref = solo_decode(model, codes[sid][1 : len(agent) + 1])
        assert ref.std() > 0.01
        np.testing.assert_allclose(pcm_out, ref, atol=TOL, rtol=0)
    assert len(rig.calls.encodes) == rig.engine.ticks  # one encode per tick, whoever is live
    assert all(len(lengths) in (1, 2, 4) for lengths in rig.calls.encodes)


def test_user_frame_maps_back_to_the_gateway_frame_or_silence(model: MimiModel) -> None:
    rig = make_rig(model, sessions=1)
    rig.engine.join("a")
    rig.engine.start("a")
    rig.engine.push_audio("a", speech(3, 2), 0)
    for _ in range(4):
        rig.tick()
    assert [u.source_frame for u in rig.user["a"]] == [0, 1, -1, -1]
    codes = agent_codes(4, 5)
    rig.engine.push_agent("a", AgentFrame(0, codes[0], 7, "", -1))  # the prompt's step
    rig.engine.push_agent("a", AgentFrame(1, codes[1], 8, "hi", 1))  # talker dropped user frame 0
    rig.engine.push_agent("a", AgentFrame(2, codes[2], 9, "", 3))  # ... and 2
    rig.engine.push_agent("a", AgentFrame(3, codes[3], 9, "", 0))  # already gone: unknown, -1
    rig.run(rig.clock.now + 0.01)
    assert [(a.frame, a.user_frame, a.transcript, a.text_token) for a in rig.agent["a"]] == [
        (0, -1, "", 7),
        (1, 1, "hi", 8),
        (2, -1, "", 9),
        (3, -1, "", 9),
    ]


def test_late_frames_are_counted_against_their_tick(model: MimiModel) -> None:
    rig = make_rig(model, sessions=2)
    before = metrics.DUPLEX_LATE_FRAMES._value.get()
    rig.engine.join("a")
    rig.engine.start("a")
    codes = agent_codes(5, 4)
    rig.tick()
    tick_start = rig.clock.now
    rig.clock.now = tick_start + 0.05
    answer(rig, "a", codes, 1)  # user frame 0: on time
    rig.run(rig.clock.now)
    rig.tick()
    rig.clock.now = tick_start + 0.081 + TICK  # user frame 1 answered 1 ms after its deadline
    answer(rig, "a", codes, 2)
    rig.run(rig.clock.now)
    rig.engine.push_agent("a", AgentFrame(3, codes[3], 0, "", -1))  # the prompt's step: tied to no tick
    rig.run(rig.clock.now + 0.01)
    assert [a.late for a in rig.agent["a"]] == [False, True, False]
    assert rig.engine.info("a").late == 1
    assert metrics.DUPLEX_LATE_FRAMES._value.get() - before == 1


def test_jitter_buffer_is_bounded_and_drops_the_oldest_frames(model: MimiModel) -> None:
    rig = make_rig(model, sessions=1, jitter_samples=4 * SPF)
    before = metrics.DUPLEX_JITTER_DROPPED._value.get()
    rig.engine.join("a")
    rig.engine.start("a")
    audio = speech(6, 7)
    rig.engine.push_audio("a", audio[: 3 * SPF + 100], 0)
    rig.engine.push_audio("a", audio[3 * SPF + 100 : 6 * SPF], 3 * SPF + 100)  # 6 frames into 4: drop 2
    info = rig.engine.info("a")
    assert (info.buffered, info.dropped_samples) == (4 * SPF, 2 * SPF)
    assert metrics.DUPLEX_JITTER_DROPPED._value.get() - before == pytest.approx(2 * SPF / 24000)
    rig.tick()
    (u,) = rig.user["a"]
    assert (u.source_frame, u.freed_samples) == (2, 3 * SPF)  # the newest audio is kept; drops re-granted
    with pytest.raises(ValueError, match="sample_offset: expected 11520"):
        rig.engine.push_audio("a", audio[:SPF], 0)
    with pytest.raises(ValueError, match="exceed the 7680-sample jitter buffer"):
        rig.engine.push_audio("a", np.zeros(5 * SPF, np.float32), 6 * SPF)
    with pytest.raises(ValueError, match="NaN"):
        rig.engine.push_audio("a", np.full(10, np.nan, np.float32), 6 * SPF)
    with pytest.raises(ValueError, match=r"frames.codes: must lie in \[0, 2048\)"):
        rig.engine.push_agent("a", AgentFrame(0, np.full(K, 2048), 0, "", -1))


def test_admission_leave_and_end_of_input(model: MimiModel) -> None:
    rig = make_rig(model, sessions=2)
    assert rig.engine.join("a") == 0 and rig.engine.join("b") == 1
    with pytest.raises(DuplexAdmissionError):
        rig.engine.join("c")
    rig.engine.start("a")
    rig.engine.start("b")
    rig.tick()
    rig.engine.end_input("a")
    rig.tick()
    assert len(rig.user["a"]) == 1 and len(rig.user["b"]) == 2  # a no longer ticks
    with pytest.raises(ValueError, match="after end_of_input"):
        rig.engine.push_audio("a", np.zeros(SPF, np.float32), 0)
    codes = agent_codes(7, 2)
    answer(rig, "a", codes, 1)  # a's agent frames still decode until it leaves
    rig.run(rig.clock.now + 0.01)
    assert len(rig.agent["a"]) == 1
    assert rig.engine.leave("a") and not rig.engine.leave("a")
    assert rig.engine.sessions() == 1 and rig.engine.info("b").slot == 0
    assert rig.engine.join("c") == 1  # the slot is free at once, before the next tick
    rig.engine.leave("b")
    rig.engine.leave("c")
    assert rig.engine.idle_timeout() is None and not rig.engine.has_work()  # no live session: no clock


def test_voice_recording_is_prepared_and_encoded_like_offline_without_stalling_ticks(
    model: MimiModel,
) -> None:
    rig = make_rig(model, sessions=2, reference_chunk_frames=4)
    rate = 16000
    t = np.arange(int(2.3 * rate)) / rate
    clip = (0.3 * np.sin(2 * np.pi * 220 * t) * (1 + 0.3 * np.sin(t * 5))).astype(np.float32)
    prepared = prepare_reference(clip, rate)
    assert prepared.size % SPF == 0 and prepared.size == 29 * SPF
    assert integrated_loudness(prepared, 24000) == pytest.approx(-24.0, abs=0.05)
    rig.engine.join("a")
    rig.engine.start("a")
    jobs = rig.engine.references
    encode_chunk = jobs.step

    def slow_chunk() -> None:  # each chunk takes 30 ms of the engine's clock
        chunk_start = rig.clock.now
        encode_chunk()
        rig.clock.now = chunk_start + 0.03
        jobs.chunk_seconds = 0.03

    jobs.step = slow_chunk  # type: ignore[method-assign]
    future = rig.engine.submit_reference(prepared)
    starts = []
    while not future.done():
        starts.append(rig.engine._next_tick)
        rig.tick()
    # 29 frames in chunks of 4: two chunks fit between ticks, a third would overrun, so it waits. Every
    # tick ran at its start on the grid and the session's user frames kept flowing meanwhile.
    assert len(starts) == 3 and rig.engine.skipped_ticks == 0
    assert np.diff(starts) == pytest.approx([TICK] * 2)
    assert len(rig.user["a"]) == 3
    with torch.inference_mode():
        offline = model.encode(torch.from_numpy(prepared)[None])[0].numpy().T
    np.testing.assert_array_equal(future.result(), offline)
    with pytest.raises(ValueError, match="exceeds the limit of 30 s"):
        prepare_reference(np.zeros(31 * 8000, np.float32), 8000)
    with pytest.raises(ValueError, match="NaN"):
        prepare_reference(np.full(100, np.inf, np.float32), 8000)


def test_graphed_calls_run_eagerly_on_cpu_and_equal_the_plain_calls(model: MimiModel) -> None:
    results = []
    for graphed in (False, True):
        codec = MimiStreamingCodec(model, 3)
        calls = GraphedDuplexCalls(codec, max_batch=2, device="cpu") if graphed else PackedCalls(codec)
        clock = Clock()
        engine = DuplexCodecEngine(codec, DuplexCodecConfig(max_sessions=2), calls=calls, clock=clock)
        rig = EngineRig(engine, CountingCalls(codec), clock)
        engine.warm_up()
        assert engine.sessions() == 0 and engine.ticks == 0
        engine.join("a")
        engine.start("a")
        engine.push_audio("a", speech(9, 3), 0)
        codes = agent_codes(9, 4)
        for n in range(3):
            rig.tick()
            answer(rig, "a", codes, n + 1)
            rig.run(clock.now + 0.001)
        results.append(
            (np.stack([u.codes for u in rig.user["a"]]), np.concatenate([a.pcm for a in rig.agent["a"]]))
        )
    np.testing.assert_array_equal(results[0][0], results[1][0])
    np.testing.assert_array_equal(results[0][1], results[1][1])


def test_a_clock_far_behind_skips_ticks_instead_of_bursting(model: MimiModel) -> None:
    rig = make_rig(model, sessions=1)
    rig.engine.join("a")
    rig.engine.start("a")
    rig.tick()
    rig.clock.now += 5 * TICK + 0.01  # the engine thread was stalled past five tick starts
    rig.run(rig.clock.now)
    # One tick runs for the oldest missed start; the four after it are skipped; the grid is kept.
    assert rig.engine.ticks == 2 and rig.engine.skipped_ticks == 4
    assert len(rig.user["a"]) == 2
    assert rig.engine.idle_timeout() == pytest.approx(TICK - 0.01)


def test_the_audio_of_skipped_ticks_is_dropped_so_answers_do_not_stay_late(model: MimiModel) -> None:
    rig = make_rig(model, sessions=3)
    dropped_s = metrics.DUPLEX_JITTER_DROPPED._value.get()
    skipped = metrics.DUPLEX_SKIPPED_TICKS._value.get()
    audio = {sid: speech(ord(sid), 8) for sid in "abc"}
    sent = dict.fromkeys("abc", 0)

    def send(sid: str, frames: int) -> None:  # the client's next `frames` frames, in order
        first = sent[sid]
        rig.engine.push_audio(sid, audio[sid][first * SPF : (first + frames) * SPF], first * SPF)
        sent[sid] += frames

    for sid in "ab":
        rig.engine.join(sid)
        rig.engine.start(sid)
        send(sid, 1)
    rig.tick()
    # The engine thread stalls past five tick starts. Meanwhile a's client keeps real time (five frames);
    # b's falls behind too (one frame).
    rig.clock.now += 5 * TICK + 0.01
    send("a", 5)
    send("b", 1)
    rig.run(rig.clock.now)  # one tick for the oldest missed start, four skipped
    assert rig.engine.skipped_ticks == 4
    send("a", 1)
    send("b", 1)
    rig.engine.join("c")  # joins after the stall, with a burst of audio: it owes nothing
    rig.engine.start("c")
    send("c", 3)
    rig.tick()
    # a's four frames of the skipped ticks are dropped and it hears its newest frame; b held only the one
    # frame this tick takes, so it loses nothing. Without the drop a's answers would stay 4 ticks behind.
    assert [u.source_frame for u in rig.user["a"]] == [0, 1, 6]
    assert [u.source_frame for u in rig.user["b"]] == [0, 1, 2]
    assert [u.source_frame for u in rig.user["c"]] == [0] and rig.engine.info("c").buffered == 2 * SPF
    assert rig.user["a"][-1].freed_samples == 5 * SPF  # the dropped audio is granted again with the tick's
    assert rig.engine.info("a").dropped_samples == 4 * SPF and rig.engine.info("b").dropped_samples == 0
    assert rig.engine.info("a").buffered == 0
    assert metrics.DUPLEX_JITTER_DROPPED._value.get() - dropped_s == pytest.approx(4 * SPF / 24000)
    assert metrics.DUPLEX_SKIPPED_TICKS._value.get() - skipped == 4
    send("a", 1)
    rig.tick()  # the drop is owed once: the next tick takes the next frame
    assert rig.user["a"][-1].source_frame == 7
