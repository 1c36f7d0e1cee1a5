"""Talker and codec as real processes on localhost: parity, cancellation, shm, peer death, multi-host, drain.

Two deployments: pair A (tiny CustomVoice preset) on 127.0.0.1 with a tiny shm threshold (frames go through
shared memory) and metrics ports; pair B (tiny Base preset, voice cloning) on two "hosts" (network
namespaces when available, else two loopback addresses) with a huge threshold (everything inline).
Requests are kept to a few dozen frames so the module stays well under two minutes on two cores.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import numpy as np
import pytest

from tests.integration.deploykit import free_port
from tests.integration.netns import make_hosts
from tests.integration.reference import TEXT, TEXT_HEAD, TEXT_TAIL, in_process_reference
from tests.integration.stagekit import (
    MODEL,
    NOT_SERVING,
    SERVING,
    SPF,
    Result,
    StageProc,
    codec_status,
    eventually,
    exchange,
    health,
    metric,
    open_msg,
    reference_clip,
    shm_files,
    start_stage,
    synthesize,
    talker_status,
)
from voxstage.internal.v1 import stage_pb2 as S
from voxstage.transport.shm_reader import ShmReader

pytestmark = pytest.mark.timeout(120)

FRAMES = 24
SMALL_SHM = "connectors.connector_of_shared_memory.extra.shm_threshold_bytes=64"
HUGE_SHM = "connectors.connector_of_shared_memory.extra.shm_threshold_bytes=1000000000"
MAX_TOKENS = f"stages.0.default_sampling_params.max_tokens={FRAMES}"
BASE_MODEL = "qwen3-tts-tiny-base"  # pair B serves voice cloning
# The seeds' 3 s stall timeout assumes a talker at least 0.67x real time (a 25-frame chunk is 2 s of audio);
# the tiny models on a shared 2-core box can be slower, so the normal pairs allow 30 s and one codec keeps
# a 0.2 s stall timeout to prove the timeout fires.
RELAXED_STALL = "connectors.connector_of_shared_memory.extra.connector_get_max_wait=3000"
# Pair A cuts fixed chunks (1, then 25): the stall test needs the talker to hold frames 2..24 for a long,
# predictable gap, and the shm test counts bytes per chunk. Pair B keeps the default ramp.
NO_RAMP = "connectors.connector_of_shared_memory.extra.codec_chunk_ramp=false"
STRICT_STALL = "connectors.connector_of_shared_memory.extra.connector_get_max_wait=20"


@dataclass
class Pair:
    talker: StageProc
    codec: StageProc
    talker_address: str  # as the codec dials it
    talker_port: int
    talker_metrics: int | None = None
    codec_metrics: int | None = None
    restart: dict[str, object] | None = None
    strict_codec: StageProc | None = None  # same talker, a 0.2 s stall timeout


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from voxstage.presets import resolve_model

    path = tmp_path_factory.mktemp("vxcache")
    for model in (MODEL, BASE_MODEL):
        resolve_model(model, cache=path)  # materialize once, before any process races to
    return path


@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("stage-logs")


def _stop_all(procs: list[StageProc]) -> None:
    for p in procs:  # signal every process first: they drain in parallel
        if p.proc.poll() is None:
            p.proc.send_signal(signal.SIGTERM)
    for p in procs:
        p.stop()


@dataclass
class Deployment:
    a: Pair
    b: Pair
    procs: list[StageProc]


@pytest.fixture(scope="module")
def deployment(cache: Path, logs: Path) -> Iterator[Deployment]:
    """Both pairs and the strict codec start together (their start-up overlaps); all stop together."""
    h, how = make_hosts()
    print(f"multi-host via {how}")
    tp, cp, sp, tm, cm, btp, bcp = (free_port() for _ in range(7))
    kw_a = {"cache": cache, "logs": logs, "sets": [SMALL_SHM, MAX_TOKENS, RELAXED_STALL, NO_RAMP]}
    kw_b = {"cache": cache, "logs": logs, "sets": [HUGE_SHM, MAX_TOKENS, RELAXED_STALL], "model": BASE_MODEL}
    procs = [
        start_stage("talker", port=tp, metrics_port=tm, **kw_a),  # type: ignore[arg-type]
        start_stage("codec", port=cp, metrics_port=cm, **kw_a),  # type: ignore[arg-type]
        start_stage("codec", port=sp, cache=cache, logs=logs, sets=[STRICT_STALL, NO_RAMP], tag="-strict"),
        start_stage(
            "talker",
            port=btp,
            listen=h.talker_listen,
            reach=h.talker_from_test,
            netns=h.talker_ns,
            **kw_b,  # type: ignore[arg-type]
        ),
        start_stage(
            "codec",
            port=bcp,
            listen=h.codec_listen,
            reach=h.codec_from_test,
            netns=h.codec_ns,
            **kw_b,  # type: ignore[arg-type]
        ),
    ]
    a = Pair(procs[0], procs[1], f"127.0.0.1:{tp}", tp, tm, cm, restart={"kw": kw_a}, strict_codec=procs[2])
    b = Pair(procs[3], procs[4], f"{h.talker_from_codec}:{btp}", btp)
    dep = Deployment(a, b, procs)
    try:
        for proc in procs:
            proc.wait_serving()
        yield dep
    finally:
        everything = procs if a.talker is procs[0] else [*procs, a.talker]  # a.talker may be a restart
        _stop_all(everything)
        h.teardown()
    for p in everything:
        assert not shm_files(p.pid), f"{p.role} {p.pid} left shared memory behind"


@pytest.fixture(scope="module")
def pair_a(deployment: Deployment) -> Pair:
    return deployment.a


@pytest.fixture(scope="module")
def pair_b(deployment: Deployment) -> Pair:
    return deployment.b


async def _not_serving(address: str) -> int | None:
    status = await health(address)
    return status if status != SERVING else None


# ---- pair A: same host, frames through shared memory ---------------------------------------------------


async def test_a_processes_equal_in_process_engines(pair_a: Pair, cache: Path) -> None:
    res = await synthesize(pair_a.codec.address, pair_a.talker_address, TEXT, seed=42)
    assert res.eos is not None and res.eos.reason == S.END_REASON_MAX_FRAMES, res.eos
    assert res.opened is not None and res.opened.sample_rate_hz == 24000
    assert [c.sample_offset for c in res.chunks] == np.cumsum(
        [0] + [c.sample_count for c in res.chunks[:-1]]
    ).tolist()
    assert res.chunks[0].frame_count == 1  # the seed's first chunk is one frame
    assert res.eos.frame_count == FRAMES and res.eos.sample_count == FRAMES * SPF
    assert res.segment_done is not None and res.segment_done.frame_count == FRAMES
    ref = in_process_reference(cache, FRAMES, seed=42)
    assert ref.std() > 0.01
    np.testing.assert_allclose(res.audio, ref, atol=1e-5, rtol=0)
    other = await synthesize(pair_a.codec.address, pair_a.talker_address, TEXT, seed=43)
    assert not np.allclose(other.audio[: ref.size], ref[: other.audio.size], atol=1e-3)


async def test_a_streamed_text_equals_in_process_engines(pair_a: Pair, cache: Path) -> None:
    # Text deltas without a flush: past early_start_chars the talker starts the segment in streaming-text
    # mode and takes later deltas; the result equals the engines fed the same way in process.
    res = await synthesize(pair_a.codec.address, pair_a.talker_address, TEXT_HEAD, stream_text=TEXT_TAIL)
    assert res.eos is not None and res.eos.reason == S.END_REASON_MAX_FRAMES, res.eos
    expected = in_process_reference(cache, FRAMES, seed=42, stream_text=TEXT_TAIL)
    np.testing.assert_allclose(res.audio, expected, atol=1e-5, rtol=0)
    whole = in_process_reference(cache, FRAMES, seed=42)
    assert not np.allclose(whole, expected, atol=1e-3)  # a different prompt mode than the unary request


async def test_a_text_in_the_open_equals_text_after_it(pair_a: Pair, cache: Path) -> None:
    # The gateway puts a text it already holds (and the end of input after it) inside the open (§2): the
    # talker handles them as the messages they stand for, so the audio is the same.
    whole = await synthesize(pair_a.codec.address, pair_a.talker_address, TEXT, in_open=True)
    assert whole.eos is not None and whole.eos.reason == S.END_REASON_MAX_FRAMES, whole.eos
    np.testing.assert_allclose(whole.audio, in_process_reference(cache, FRAMES, seed=42), atol=1e-5, rtol=0)
    streamed = await synthesize(
        pair_a.codec.address, pair_a.talker_address, TEXT_HEAD, stream_text=TEXT_TAIL, in_open=True
    )
    expected = in_process_reference(cache, FRAMES, seed=42, stream_text=TEXT_TAIL)
    np.testing.assert_allclose(streamed.audio, expected, atol=1e-5, rtol=0)
    # Deltas whose end rode in the open with them (a gRPC client that wrote its text and ended): whole, so
    # never started early in streaming-text mode.
    ended = await synthesize(pair_a.codec.address, pair_a.talker_address, TEXT, in_open=True, deltas=True)
    np.testing.assert_allclose(ended.audio, whole.audio, atol=1e-5, rtol=0)


async def test_b_client_cancel_frees_talker_slot_and_codec_stream(pair_a: Pair) -> None:
    seen: dict[str, float] = {}

    async def cancel_after_first(res: Result, call: grpc.aio.StreamStreamCall) -> bool:
        status = await talker_status(pair_a.talker.address)
        assert status.slots_in_use == 1 and len(status.requests) == 1
        assert status.requests[0].phase in (S.REQUEST_PHASE_RUNNING, S.REQUEST_PHASE_BLOCKED_ON_CREDIT)
        seen["tick"] = status.tick
        seen["t"] = time.monotonic()
        call.cancel()
        return False

    await synthesize(
        pair_a.codec.address, pair_a.talker_address, TEXT, max_frames=400, on_pcm=cancel_after_first
    )

    async def both_free() -> tuple[S.StageStatus, S.StageStatus] | None:
        t, c = await talker_status(pair_a.talker.address), await codec_status(pair_a.codec.address)
        # The engine's slot goes first; the servicer drops its stream after settling its loans and a short
        # wait for the peer's close (CI saw a status between the two once), so both are waited for.
        talker_held = t.slots_in_use or t.requests or t.active_streams
        codec_held = c.slots_in_use or c.requests or c.active_streams
        return (t, c) if not (talker_held or codec_held) else None

    freed = await eventually(both_free, within=2.0)
    assert freed is not None, "talker slot or codec stream still held 2 s after the client cancel"
    talker, codec = freed
    freed_after = time.monotonic() - seen["t"]
    # Nothing keeps ticking for the cancelled request: the engine is idle once its slot is gone.
    await asyncio.sleep(0.3)
    again = await talker_status(pair_a.talker.address)
    assert again.tick == talker.tick, "talker engine kept ticking after the cancel"
    assert again.active_streams == 0 and again.slots_in_use == 0
    print(f"slot free {freed_after * 1000:.0f} ms after the cancel; ticks {seen['tick']} -> {talker.tick}")


def transport(port: int, end: str) -> tuple[float, float, float]:
    """A stage's (shm bytes, inline bytes, link batches sent by its ``end``) so far."""
    name = "voxstage_transport_bytes_total"
    return (
        metric(port, name, 'path="shm"'),
        metric(port, name, 'path="inline"'),
        metric(port, "voxstage_link_batches_total", f'end="{end}"'),
    )


async def nothing_lent(port: int) -> bool | None:
    return True if metric(port, "voxstage_shm_slots_lent") == 0 else None


async def test_c_shm_above_the_threshold_by_slab_on_the_link_and_by_chunk_on_a_call(pair_a: Pair) -> None:
    # The codec carries the request on its link to the talker (docs/protocol.md §12): what the talker sends
    # in a tick goes as one slab, through shared memory above the 64-byte threshold, acked by the codec.
    talker, codec = pair_a.talker_metrics, pair_a.codec_metrics
    assert talker is not None and codec is not None
    shm, inline, batches = transport(talker, "upstream")
    res = await synthesize(pair_a.codec.address, pair_a.talker_address, TEXT)
    assert res.eos is not None and res.eos.reason == S.END_REASON_MAX_FRAMES
    shm2, inline2, batches2 = transport(talker, "upstream")
    # The 23-frame chunk's codes (16 groups of int16 a frame) crossed in a slab through shared memory...
    assert shm2 - shm >= (FRAMES - 1) * 16 * 2
    # ...and every slab that went inline was within the threshold.
    assert batches2 > batches and inline2 - inline <= 64 * (batches2 - batches)
    assert await eventually(lambda: nothing_lent(talker), within=2.0), "the codec did not ack every slab"
    assert any(name.endswith("-probe") for name in shm_files(pair_a.talker.pid))

    # A Stream call of its own (this test's client, as a tool by hand or a gateway older than links is): the
    # codec lends each PCM chunk above the threshold in shared memory by itself, freed on its ack (§9).
    before, _, _ = transport(codec, "upstream")
    lent = await synthesize(pair_a.codec.address, pair_a.talker_address, TEXT, shm=ShmReader())
    assert lent.eos is not None and lent.eos.reason == S.END_REASON_MAX_FRAMES
    assert [c.data.WhichOneof("body") for c in lent.chunks] == ["shm", "shm"]  # 1 frame, then 23
    after, _, _ = transport(codec, "upstream")
    assert after - before == FRAMES * SPF * 4  # every f32 sample, chunk by chunk, and nothing else
    assert await eventually(lambda: nothing_lent(codec), within=2.0), "the codec kept a chunk after its ack"
    np.testing.assert_array_equal(lent.audio, res.audio)  # the same seeded request, read out of shm


async def test_c_talker_kill9_fails_fast_then_a_restarted_talker_serves(pair_a: Pair, cache: Path) -> None:
    victim = pair_a.talker
    killed: dict[str, float] = {}
    assert shm_files(victim.pid), "the talker should own shared memory before it is killed"

    async def kill_after_first(res: Result, call: grpc.aio.StreamStreamCall) -> bool:
        if not killed:
            victim.proc.send_signal(signal.SIGKILL)
            killed["t"] = time.monotonic()
        return True

    res = await synthesize(
        pair_a.codec.address, pair_a.talker_address, TEXT, max_frames=400, on_pcm=kill_after_first
    )
    waited = time.monotonic() - killed["t"]
    assert res.eos is not None and res.eos.reason == S.END_REASON_ERROR, res.eos
    assert res.eos.error.code == grpc.StatusCode.UNAVAILABLE.value[0], res.eos.error
    assert waited < 2.0, f"the client waited {waited:.2f} s for the failure"
    victim.proc.wait(5)
    assert shm_files(victim.pid) == [], "the codec should have reaped the dead talker's shared memory"
    codec = await codec_status(pair_a.codec.address)
    assert codec.slots_in_use == 0 and codec.active_streams == 0
    # Same port, new process: the codec must dial it afresh and succeed.
    assert pair_a.restart is not None
    kw = pair_a.restart["kw"]
    pair_a.talker = start_stage(
        "talker",
        port=pair_a.talker_port,
        metrics_port=pair_a.talker_metrics,
        tag="-restarted",
        **kw,  # type: ignore[arg-type]
    )
    pair_a.talker.wait_serving()
    ok = await synthesize(pair_a.codec.address, pair_a.talker_address, TEXT)
    assert ok.eos is not None and ok.eos.reason == S.END_REASON_MAX_FRAMES, ok.eos
    assert ok.eos.sample_count == FRAMES * SPF


async def test_stall_timeout_fails_the_request_and_frees_the_talker(pair_a: Pair) -> None:
    assert pair_a.strict_codec is not None
    # The talker holds frames 2..24 until the take ends (no 25-frame boundary): a gap of ~23 ticks.
    res = await synthesize(pair_a.strict_codec.address, pair_a.talker_address, TEXT)
    assert res.eos is not None and res.eos.reason == S.END_REASON_ERROR, res.eos
    err = res.eos.error
    assert err.code == grpc.StatusCode.DEADLINE_EXCEEDED.value[0] and "stall timeout" in err.message, err
    assert "0.2 s" in err.message and err.origin == "codec"

    async def free() -> S.StageStatus | None:
        status = await talker_status(pair_a.talker.address)
        return status if not status.slots_in_use and not status.requests else None

    assert await eventually(free, within=2.0) is not None, "the codec must cancel the talker on a timeout"


async def test_bad_requests_fail_in_band_naming_the_field(pair_a: Pair) -> None:
    talker = pair_a.talker_address
    dead = f"127.0.0.1:{free_port()}"  # nothing listens there
    text, eoi = S.CodecStreamRequest(text=TEXT), S.CodecStreamRequest(end_of_input=S.EndOfInput())
    tiny = S.Credit(unit=S.CREDIT_UNIT_SAMPLES, amount=100)  # smaller than one chunk
    frames = S.Credit(unit=S.CREDIT_UNIT_FRAMES, amount=10**6)  # wrong unit for PCM
    cases = [
        ([text], 3, "first message must be open", "codec"),
        ([S.CodecStreamRequest(open=open_msg(talker, voice="nobody")), text, eoi], 5, "voice", "talker"),
        ([S.CodecStreamRequest(open=open_msg(talker, model="other-model"))], 5, "model", "codec"),
        ([S.CodecStreamRequest(open=open_msg(""))], 3, "talker_address", "codec"),
        ([S.CodecStreamRequest(open=open_msg(talker, initial_credit=tiny))], 3, "initial_credit", "codec"),
        ([S.CodecStreamRequest(open=open_msg(talker, initial_credit=frames))], 3, "initial_credit", "codec"),
        ([S.CodecStreamRequest(open=open_msg(dead))], 14, dead, "codec"),
        ([S.CodecStreamRequest(open=open_msg(talker, initial_end_of_input=True))], 3, "initial_end_of_input",
         "codec"),
        ([S.CodecStreamRequest(open=open_msg(talker, initial_text="   ", initial_end_of_input=True))], 3,
         "initial_end_of_input", "codec"),
    ]  # fmt: skip
    for messages, code, needle, origin in cases:
        t0 = time.monotonic()
        out = await exchange(pair_a.codec.address, messages)
        assert [r.WhichOneof("response") for r in out] == ["end_of_stream"], out  # refused: no `opened`
        err = out[0].end_of_stream.error
        assert (err.code, err.origin) == (code, origin) and needle in err.message, err
        assert time.monotonic() - t0 < 6.0
    # Unknown sampling values are checked at open too; the codec and talker are still healthy after all that.
    bad_k = open_msg(talker)
    bad_k.sampling.top_k = -5
    out = await exchange(pair_a.codec.address, [S.CodecStreamRequest(open=bad_k)])
    assert out[-1].end_of_stream.error.code == 3 and "top_k" in out[-1].end_of_stream.error.message
    status = await codec_status(pair_a.codec.address)
    assert status.ready and status.slots_in_use == 0


# ---- pair B: two hosts, everything inline ------------------------------------------------------------


async def test_d_multi_host_voice_clone_streams_inline(pair_b: Pair, cache: Path) -> None:
    # ICL voice clone: reference audio (16 kHz, resampled by the codec) -> codes + x-vector -> talker.
    ref = reference_clip(text="a reference transcript")
    res = await synthesize(pair_b.codec.address, pair_b.talker_address, TEXT, voice="", reference=ref, seed=7)
    assert res.eos is not None and res.eos.reason == S.END_REASON_MAX_FRAMES, res.eos
    # The reference's own audio (decoded to warm the codec state) is dropped: only generated frames remain.
    assert res.eos.sample_count == FRAMES * SPF and res.audio.size == FRAMES * SPF
    assert all(c.data.WhichOneof("body") == "inline" for c in res.chunks)
    expected = in_process_reference(cache, FRAMES, 7, model=BASE_MODEL, reference=ref)
    np.testing.assert_allclose(res.audio, expected, atol=1e-5, rtol=0)
    talker = await talker_status(pair_b.talker.address)
    assert talker.transport.shm_threshold_bytes == 1_000_000_000
    # No payload of pair B's talker is large enough for shm: nothing in its regions but the probe.
    assert [f for f in shm_files(pair_b.talker.pid) if not f.endswith("-probe")] == []


async def test_e_sigterm_drains_in_flight_stream_then_exits_0(pair_b: Pair) -> None:
    talker = pair_b.talker
    state: dict[str, object] = {}

    async def term_after_first(res: Result, call: grpc.aio.StreamStreamCall) -> bool:
        if not state:
            talker.proc.send_signal(signal.SIGTERM)
            state["sent"] = True
            status = await eventually(lambda: _not_serving(talker.address), within=2.0)
            state["health"] = status
        return True

    res = await synthesize(
        pair_b.codec.address,
        pair_b.talker_address,
        TEXT,
        voice="",
        reference=reference_clip(),  # x-vector only (no transcript)
        on_pcm=term_after_first,
    )
    # Health stays reachable while draining and says NOT_SERVING (not an unreachable server).
    assert state.get("health") == NOT_SERVING, state
    assert res.eos is not None and res.eos.reason == S.END_REASON_MAX_FRAMES, res.eos
    assert res.eos.sample_count == FRAMES * SPF
    assert talker.proc.wait(20) == 0, talker.tail()
