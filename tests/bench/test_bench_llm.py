"""The LLM-rate workload without a real stack: the delta tokenizer, the answers file, per-segment fixed
length, the client's schedule against a fake gRPC server, and the report's LLM and pairs tables."""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from bench.clients import Synthesis
from bench.gpu_report import write_report
from bench.llm_stream import GrpcLlmClient, llm_tokens, load_answers, segment_budget, sentence_count
from bench.records import Outcome, build_record
from voxstage.v1 import speech_pb2, speech_pb2_grpc

SR = 24000
SPF = 1920


def test_tokens_are_small_pieces_with_punctuation_apart() -> None:
    text = "Numbers like 3.5 do not end it. Really? Yes!"
    tokens = llm_tokens(text)
    assert "".join(tokens) == text
    assert tokens[:6] == ["Numb", "ers", " lik", "e", " 3.5", " do"]
    assert all(len(t) <= 4 for t in tokens)
    assert [t for t in tokens if t in ".!?"] == [".", "?", "!"]
    assert sentence_count(tokens) == 3
    assert sentence_count(llm_tokens("One. Two without an end")) == 2
    assert segment_budget(100, 10) == 10 and segment_budget(100, 12) == 9 and segment_budget(1, 10) == 1


def test_answers_are_about_200_tokens_and_outpace_their_audio() -> None:
    answers = load_answers()
    assert len(answers) >= 3
    for text in answers:
        tokens = llm_tokens(text)
        assert 170 <= len(tokens) <= 230 and sentence_count(tokens) == 10
        # Sentence k's text (30 tokens/s) must be in before the audio of the k sentences before it has played
        # (10 frames = 0.8 s each at --frames 100), with room to spare, or the workload underruns by design.
        ends = [i + 1 for i, t in enumerate(tokens) if t in ".!?"]
        for k, end in enumerate(ends[:-1]):
            assert end / 30 <= 0.8 * (k + 1) - 0.1, (k, end)


def _llm_record(segments: int, frames_each: int, sentences: int = 3) -> bool | None:
    out = Outcome(start=1.0, ok=True, code="OK", sample_rate=SR, end=3.0, segments=segments, text_done=2.0)
    out.reads = [(1.2, 2 * SPF * frames_each * segments)]
    rec = build_record(
        out, index=0, api="grpc-llm", prompt_id=0, text="x", seed=1, level_start=0.0, done=3.0,
        scheduled_s=1.0, warmup=False, fixed_frames=frames_each, sentences=sentences,
    )  # fmt: skip
    assert rec.text_done_s == pytest.approx(1.0) and rec.audio_before_text_done is True
    return rec.length_ok


def test_llm_fixed_length_is_per_segment() -> None:
    assert _llm_record(3, 4) is True
    assert _llm_record(5, 4) is True  # the server cut a sentence in two: still every take at its budget
    assert _llm_record(2, 4) is False  # a sentence without a segment


class FakeSpeech(speech_pb2_grpc.SpeechServicer):
    """Records every request message with its arrival time; one 2-frame segment per flush."""

    def __init__(self) -> None:
        self.got: list[tuple[float, str, str]] = []

    async def StreamingSynthesize(  # noqa: N802 - the gRPC method name
        self, request_iterator: AsyncIterator[speech_pb2.StreamingSynthesizeRequest], context: object
    ) -> AsyncIterator[speech_pb2.StreamingSynthesizeResponse]:
        resp = speech_pb2.StreamingSynthesizeResponse
        yield resp(started=speech_pb2.StreamStarted(request_id="r", sample_rate_hz=SR))
        segment, offset = 0, 0
        async for req in request_iterator:
            kind = req.WhichOneof("request")
            self.got.append((time.perf_counter(), kind, req.text))
            if kind == "flush":
                audio = speech_pb2.AudioChunk(
                    data=bytes(4 * SPF), sample_offset=offset, segment_index=segment
                )
                yield resp(audio=audio)
                yield resp(segment_done=speech_pb2.SegmentDone(segment_index=segment, sample_count=2 * SPF))
                segment, offset = segment + 1, offset + 2 * SPF
        self.got.append((time.perf_counter(), "half-close", ""))
        yield resp(summary=speech_pb2.SynthesisSummary(request_id="r", frame_count=2 * segment))


async def test_client_sends_deltas_on_schedule_with_a_flush_per_sentence() -> None:
    server = grpc.aio.server()
    fake = FakeSpeech()
    speech_pb2_grpc.add_SpeechServicer_to_server(fake, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    text = "One two. Three four five? Six!"
    client = GrpcLlmClient(f"127.0.0.1:{port}", tokens_per_s=100.0)
    try:
        await client.connect(10)
        out = await client.run(Synthesis(text=text, seed=1, max_frames=2), 10)
    finally:
        await client.aclose()
        await server.stop(None)
    assert out.ok, out.detail
    kinds = [k for _, k, _ in fake.got]
    assert kinds[0] == "config" and kinds[-1] == "half-close"
    texts = [t for _, k, t in fake.got if k == "text"]
    assert texts == llm_tokens(text)
    # A flush right after each sentence end, nowhere else.
    after = [kinds[i - 1] == "text" and fake.got[i - 1][2] for i, k in enumerate(kinds) if k == "flush"]
    assert after == [".", "?", "!"]
    assert out.segments == 3 and out.frames == 6 and len(out.reads) == 3
    n = len(texts)
    assert out.text_done is not None
    # Absolute schedule: the last of n deltas leaves (n - 1) / rate after the start, not later (CI slack).
    assert (n - 1) / 100 <= out.text_done - out.start < (n - 1) / 100 + 0.25
    assert out.send_lag_max_s is not None and out.send_lag_max_s < 0.25
    arrivals = [t for t, k, _ in fake.got if k == "text"]
    assert all(b >= a for a, b in itertools.pairwise(arrivals))


def _loadgen_doc(level: float, ttfa: float, passed: bool, **extra: object) -> dict:
    agg = {
        "requests": 4, "ok": 4, "errors_by_code": {}, "underrun_rate": 0.0, "peak_in_flight": level,
        "ttfa_s": {"p50": ttfa, "p90": ttfa, "p95": ttfa, "p99": ttfa}, "rtf": {"p50": 0.2},
        "e2e_s": {"p50": 1.0}, "audio_s_per_s": 10.0 * level, **extra,
    }  # fmt: skip
    return {"kind": "closed", "level": level, "aggregate": agg, "verdict": {"pass": passed, "reason": "x"}}


def test_report_puts_llm_beside_whole_text_and_two_pairs_beside_one(tmp_path: Path) -> None:
    def write(name: str, levels: list[dict], best: float | None = None) -> None:
        search = None if best is None else {"kind": "closed", "best": best, "first_failure": 2 * best}
        doc = {"levels": levels, "search": search and {**search, "limited_by": "gate"}}
        (tmp_path / f"{name}.json").write_text(json.dumps(doc))

    llm = {"audio_before_text_done": 3, "text_done_s": {"p50": 6.5}, "send_lag_max_s": 0.002}
    for tag, best in (("0.6b", 32), ("0.6b_2pairs", 48)):
        (tmp_path / f"serve_{tag}.json").write_text("{}")
        write(f"ttfa_1rps_{tag}", [_loadgen_doc(1, 0.1, True)])
        write(
            f"closed_search_{tag}", [_loadgen_doc(best, 0.2, True), _loadgen_doc(2 * best, 2.0, False)], best
        )
    write("ttfa_1rps_llm_0.6b", [_loadgen_doc(1, 0.15, True, **llm)])
    write("c1_llm_0.6b", [_loadgen_doc(1, 0.12, True, **llm)])
    write("closed_search_llm_0.6b", [_loadgen_doc(16, 0.3, True, **llm)], 16)
    summary = write_report(tmp_path)["models"]
    s = summary["qwen3-tts-0.6b"]
    assert s["ttfa_1rps_llm"]["audio_before_text_done_rate"] == 0.75
    assert s["c1_llm"]["text_done_p50_s"] == 6.5 and s["closed_search_llm"]["best"] == 16
    assert summary["qwen3-tts-0.6b_2pairs"]["closed_search"]["at_best"]["ttfa_p50_ms"] == pytest.approx(200)
    md = (tmp_path / "summary.md").read_text()
    assert "| qwen3-tts-0.6b | LLM deltas | 150.0 / 150.0 / 150.0 | 0.000 | 3 of 4 | 120.0 | 16 (gate" in md
    assert "| qwen3-tts-0.6b | 1 | 32 (gate) | 100.0 | 200.0 / 200.0 |" in md
    assert "| qwen3-tts-0.6b | 2 | 48 (gate) | 100.0 | 200.0 / 200.0 |" in md


def test_client_refuses_a_zero_rate() -> None:
    with pytest.raises(ValueError):
        GrpcLlmClient("127.0.0.1:1", tokens_per_s=0)
