"""Load generator logic without a server: per-request records, aggregates, the gate and the level search."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from bench.clients import Synthesis, speech_body, synthesis_config
from bench.levels import RunConfig, run_level, search
from bench.loadgen import require_loopback
from bench.records import Gate, Outcome, RequestRecord, build_record, summarize
from voxstage.v1 import speech_pb2

SR = 24000
SPF = 1920  # samples per 80 ms frame at 24 kHz


def record(out: Outcome, *, frames: int | None = 10, warmup: bool = False, index: int = 0) -> RequestRecord:
    return build_record(
        out, index=index, api="grpc", prompt_id=3, text="hello", seed=1, level_start=9.0,
        done=(out.end or out.start) + 0.01, scheduled_s=1.0, warmup=warmup, fixed_frames=frames,
    )  # fmt: skip


def test_record_of_a_streamed_response() -> None:
    # 1 frame at +0.2 s, 9 frames at +0.5 s: the second chunk was due at +0.28 (a 220 ms stall).
    out = Outcome(start=10.0, ok=True, code="OK", sample_rate=SR, end=10.6)
    out.reads = [(10.2, 2 * SPF), (10.5, 2 * 9 * SPF)]
    r = record(out)
    assert r.ok and r.sent_s == pytest.approx(1.0)
    assert r.ttfa_s == pytest.approx(0.2) and r.e2e_s == pytest.approx(0.6)
    assert r.samples == 10 * SPF and r.audio_s == pytest.approx(0.8) and r.rtf == pytest.approx(0.75)
    assert r.length_ok is True and r.chunks == 2
    assert r.stalls == 1 and r.stall_total_s == pytest.approx(0.22) and r.stall_max_s == pytest.approx(0.22)
    assert record(out, frames=11).length_ok is False  # one frame short of a fixed 11-frame request
    assert record(out, frames=None).length_ok is None


def test_failed_and_silent_responses_have_no_latency() -> None:
    refused = record(Outcome(start=1.0, code="RESOURCE_EXHAUSTED", detail="busy"))
    assert not refused.ok and refused.code == "RESOURCE_EXHAUSTED" and refused.ttfa_s is None
    silent = record(Outcome(start=1.0, ok=True, code="OK", sample_rate=SR, end=2.0, reads=[(1.5, 1)]))
    assert not silent.ok and silent.code == "NO_AUDIO"  # one byte is not a playable 16-bit sample


def _ok(start: float, ttfa: float, late: bool, index: int) -> RequestRecord:
    out = Outcome(start=start, ok=True, code="OK", sample_rate=SR, end=start + 1.0)
    out.reads = [(start + ttfa, 2 * SPF), (start + ttfa + (0.5 if late else 0.01), 2 * 9 * SPF)]
    return record(out, index=index)


def test_summary_counts_only_measured_requests_and_the_gate_reads_it() -> None:
    recs = [_ok(10.0 + i, 0.1 * (i + 1), late=False, index=i) for i in range(4)]
    recs.append(record(Outcome(start=20.0, code="UNAVAILABLE"), warmup=True, index=4))
    agg = summarize(recs, peak_in_flight=3, offered_rate=2.0)
    assert (agg["requests"], agg["ok"], agg["errors"], agg["warmup_requests"]) == (4, 4, 0, 1)
    assert agg["ttfa_s"]["p50"] == pytest.approx(0.25) and agg["ttfa_s"]["max"] == pytest.approx(0.4)
    assert agg["underrun_rate"] == 0.0 and agg["length_mismatches"] == 0
    assert agg["wall_s"] == pytest.approx(4.01)  # first measured send (+1 s) to last completion (+5.01 s)
    assert agg["completed_rate"] == pytest.approx(4 / 4.01)
    assert agg["sent_rate"] == pytest.approx(1.0)  # 3 gaps over 3 s
    assert agg["audio_s_per_s"] == pytest.approx(3.2 / 4.01)
    assert Gate(0.5).verdict(agg) == (True, "sustained")
    assert Gate(0.3).verdict(agg)[0] is False  # p95 TTFA 385 ms
    assert Gate(None).verdict(agg)[0] is True

    with_gap = summarize([*recs[:3], _ok(14.0, 0.1, late=True, index=3)], peak_in_flight=1)
    assert with_gap["underrun_requests"] == 1 and with_gap["underrun_rate"] == 0.25
    assert Gate(None).verdict(with_gap) == (False, "1 of 4 requests underran")
    errors = summarize([*recs[:3], record(Outcome(start=14.0, code="INTERNAL"), index=3)], peak_in_flight=1)
    assert errors["errors_by_code"] == {"INTERNAL": 1}
    assert Gate(None).verdict(errors)[0] is False


class FakeClient:
    """Answers instantly; a request that starts while more than ``capacity`` are in flight underruns."""

    api = "fake"

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.in_flight = 0
        self.requests: list[Synthesis] = []

    async def connect(self, timeout_s: float) -> None:
        return None

    async def aclose(self) -> None:
        return None

    async def run(self, s: Synthesis, timeout_s: float) -> Outcome:
        self.requests.append(s)
        self.in_flight += 1
        start = time.perf_counter()  # the clock the real clients and the level use
        overloaded = self.in_flight > self.capacity
        try:
            await asyncio.sleep(0.005)
        finally:
            self.in_flight -= 1
        gap = 0.3 if overloaded else 0.0
        out = Outcome(start=start, ok=True, code="OK", sample_rate=SR, end=start + 0.01 + gap)
        out.reads = [(start + 0.001, 2 * SPF), (start + 0.002 + gap, 2 * SPF)]
        return out


def cfg(**kw: Any) -> RunConfig:
    return RunConfig(prompts=["one", "two", "three"], gate=Gate(None), **kw)


async def test_closed_loop_search_doubles_then_bisects_to_the_capacity() -> None:
    client = FakeClient(capacity=5)
    levels, result = await search(
        client, cfg(), "closed", start=1, factor=2, max_level=64, refine=3,
        # Long enough that every worker of a level has a request in flight at once even on a loaded box
        # (at 0.03 s a slow event loop once let a 6-stream level pass on 3 requests).
        duration_s=0.15, max_requests=1000, settle_s=0.0,
    )  # fmt: skip
    assert [lv["level"] for lv in levels] == [1, 2, 4, 8, 6, 5]
    assert [lv["verdict"]["pass"] for lv in levels] == [True, True, True, False, False, True]
    assert result == {"kind": "closed", "best": 5, "first_failure": 6, "limited_by": "gate"}
    assert all(lv["aggregate"]["peak_in_flight"] == lv["level"] for lv in levels)


async def test_search_reports_the_cap_and_steps_down_from_a_failing_start() -> None:
    _, capped = await search(
        FakeClient(capacity=100), cfg(), "closed", start=2, factor=2, max_level=4, refine=2,
        duration_s=0.02, max_requests=100, settle_s=0.0,
    )  # fmt: skip
    assert capped["best"] == 4 and capped["limited_by"] == "max_level"
    levels, down = await search(
        FakeClient(capacity=5), cfg(), "closed", start=16, factor=2, max_level=64, refine=2,
        duration_s=0.03, max_requests=1000, settle_s=0.0,
    )  # fmt: skip
    assert [lv["level"] for lv in levels] == [16, 8, 4, 6, 5]
    assert down == {"kind": "closed", "best": 5, "first_failure": 6, "limited_by": "gate"}
    levels, none = await search(
        FakeClient(capacity=0), cfg(), "closed", start=2, factor=2, max_level=4, refine=2,
        duration_s=0.02, max_requests=100, settle_s=0.0,
    )  # fmt: skip
    assert [lv["level"] for lv in levels] == [2, 1]
    assert none["best"] is None and none["limited_by"] == "no level passed"


async def test_open_loop_level_follows_its_seeded_schedule_and_marks_warmup() -> None:
    client = FakeClient(capacity=1000)
    config = cfg(seed=3, frames=2, warmup_s=0.1)
    rep = await run_level(client, config, "poisson", 50.0, 0.3, 1000)
    recs = rep["records"]
    assert len(recs) == len(client.requests) > 5
    assert [r["warmup"] for r in recs] == [r["scheduled_s"] < 0.1 for r in recs]
    assert rep["aggregate"]["requests"] == sum(not r["warmup"] for r in recs)
    assert all(s.max_frames == 2 for s in client.requests)
    again = await run_level(FakeClient(capacity=1000), config, "poisson", 50.0, 0.3, 1000)
    assert [r["scheduled_s"] for r in again["records"]] == [r["scheduled_s"] for r in recs]
    assert [r["prompt_id"] for r in again["records"]] == [r["prompt_id"] for r in recs]
    capped = await run_level(FakeClient(capacity=1000), config, "poisson", 50.0, 0.3, 4)
    assert len(capped["records"]) == 4


def test_request_encodings_carry_fixed_length_and_chunk_schedule() -> None:
    s = Synthesis(text="Hi.", seed=9, max_frames=100, initial_chunk_frames=2, steady_chunk_frames=4)
    c = synthesis_config(s)
    assert c.encoding == speech_pb2.AUDIO_ENCODING_PCM_S16LE and c.seed == 9
    assert c.sampling.max_frames == 100
    assert (c.chunk_schedule.initial_chunk_frames, c.chunk_schedule.steady_chunk_frames) == (2, 4)
    assert not synthesis_config(Synthesis(text="Hi.", seed=1)).sampling.HasField("max_frames")
    assert b'"max_frames": 100' in speech_body(s) and b'"response_format": "pcm"' in speech_body(s)


def test_only_loopback_targets_are_accepted() -> None:
    assert require_loopback("127.0.0.1:50051") == ("127.0.0.1", 50051)
    assert require_loopback("localhost:8000")[1] == 8000
    with pytest.raises(SystemExit):
        require_loopback("192.0.2.10:50051")
