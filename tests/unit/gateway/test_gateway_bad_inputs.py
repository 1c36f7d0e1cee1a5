"""Bad input, end to end: each case gets a precise gRPC status / HTTP code naming the field, no stage work
is started for what the gateway can judge, and a stream running meanwhile is untouched."""

from __future__ import annotations

import asyncio
import base64
import io
from collections.abc import AsyncIterator
from typing import Any

import grpc
import httpx
import numpy as np
import pytest
import soundfile as sf
from gateway_fakes import FakeCodec, FakeTalker, expected_samples
from gateway_kit import MakeStack, Stack, catalog

from voxstage.v1 import speech_pb2

OK = grpc.StatusCode.OK
INVALID = grpc.StatusCode.INVALID_ARGUMENT
PCM = speech_pb2.AUDIO_ENCODING_PCM_S16LE
LIMIT = 200  # gateway.max_text_chars for these tests


def wav_bytes(seconds: float, rate: int = 16_000) -> bytes:
    buf = io.BytesIO()
    sf.write(buf, np.zeros(int(seconds * rate), np.float32), rate, format="WAV")
    return buf.getvalue()


def cfg(**kw: Any) -> speech_pb2.SynthesisConfig:
    kw.setdefault("encoding", PCM)
    sampling = kw.pop("sampling", None)
    config = speech_pb2.SynthesisConfig(**kw)
    if sampling:
        for k, v in sampling.items():
            setattr(config.sampling, k, v)
    return config


def ref(**kw: Any) -> speech_pb2.ReferenceAudio:
    kw.setdefault("encoding", speech_pb2.AUDIO_ENCODING_WAV)
    return speech_pb2.ReferenceAudio(**kw)


# (case, config, text, expected code, text the message must contain)
UNARY: list[tuple[str, speech_pb2.SynthesisConfig, str, grpc.StatusCode, str]] = [
    ("empty text", cfg(), "", INVALID, "text: must not be empty"),
    ("blank text", cfg(), "   \n", INVALID, "text: must not be empty"),
    ("text over limit", cfg(), "x" * (LIMIT + 1), INVALID, "text: 201 characters exceeds the limit of 200"),
    ("unknown voice", cfg(voice="nobody"), "hi", grpc.StatusCode.NOT_FOUND, "config.voice: voice 'nobody'"),
    ("unknown model", cfg(model="tts-1"), "hi", grpc.StatusCode.NOT_FOUND, "config.model: model 'tts-1'"),
    ("no encoding", cfg(encoding=0), "hi", INVALID, "config.encoding: AUDIO_ENCODING_UNSPECIFIED"),
    ("bad sample rate", cfg(sample_rate_hz=1000), "hi", INVALID, "config.sample_rate_hz: must be 0 (native)"),
    (
        "opus rate",
        cfg(encoding=speech_pb2.AUDIO_ENCODING_OGG_OPUS, sample_rate_hz=44_100),
        "hi",
        INVALID,
        "config.sample_rate_hz: opus supports",
    ),
    ("unsupported language", cfg(language="klingon"), "hi", INVALID, "config.language: 'klingon'"),
    ("dialect as language", cfg(language="sichuan_dialect"), "hi", INVALID, "config.language"),
    (
        "negative temperature",
        cfg(sampling={"temperature": -0.5}),
        "hi",
        INVALID,
        "config.sampling.temperature",
    ),
    ("nan temperature", cfg(sampling={"temperature": float("nan")}), "hi", INVALID, "finite"),
    ("top_p zero", cfg(sampling={"top_p": 0.0}), "hi", INVALID, "config.sampling.top_p: must be in (0, 1]"),
    ("top_k zero", cfg(sampling={"top_k": 0}), "hi", INVALID, "config.sampling.top_k"),
    (
        "repetition penalty zero",
        cfg(sampling={"repetition_penalty": 0.0}),
        "hi",
        INVALID,
        "config.sampling.repetition_penalty",
    ),
    ("max_frames zero", cfg(sampling={"max_frames": 0}), "hi", INVALID, "config.sampling.max_frames"),
    (
        "chunk schedule inverted",
        cfg(chunk_schedule=speech_pb2.ChunkSchedule(initial_chunk_frames=30, steady_chunk_frames=10)),
        "hi",
        INVALID,
        "config.chunk_schedule.initial_chunk_frames",
    ),
    (
        "reference on a preset-voice model",
        cfg(reference_audio=ref(data=wav_bytes(1.0))),
        "hi",
        INVALID,
        "does not support voice cloning",
    ),
    (
        # The model is judged before the audio is even parsed (issue 15).
        "malformed reference on a preset-voice model",
        cfg(reference_audio=ref(data=b"RIFFnonsense" * 10)),
        "hi",
        INVALID,
        "config.reference_audio.data: model 'qwen3-tts-tiny' (custom_voice) does not support voice cloning",
    ),
]

# Judged on a voice-clone (base) model, which takes a reference: (case, reference, message).
REFERENCE_UNARY: list[tuple[str, speech_pb2.ReferenceAudio, str]] = [
    (
        "malformed reference",
        ref(data=b"RIFFnonsense" * 10),
        "config.reference_audio.data: not a decodable audio file",
    ),
    (
        "oversized reference",
        ref(data=b"\0" * (10 * 1024 * 1024 + 2), encoding=PCM, sample_rate_hz=16_000),
        "exceeds the limit of 10485760 bytes",
    ),
    ("reference too long", ref(data=wav_bytes(61.0, 8000)), "exceeds the limit of 60 s"),
    (
        "pcm reference without rate",
        ref(data=b"\0\0" * 100, encoding=PCM),
        "config.reference_audio.sample_rate_hz: required",
    ),
    (
        "reference rate out of range",
        ref(data=b"\0\0" * 100, encoding=PCM, sample_rate_hz=1000),
        "config.reference_audio.sample_rate_hz: must be in [8000, 48000], got 1000",
    ),
    (
        "reference encoding",
        ref(data=b"\0" * 100, encoding=speech_pb2.AUDIO_ENCODING_MULAW),
        "config.reference_audio.encoding: AUDIO_ENCODING_MULAW is not accepted",
    ),
    (
        "reference encoding no proto names",
        ref(data=b"\0" * 100, encoding=99),  # type: ignore[arg-type]
        "config.reference_audio.encoding: 99 is not accepted",
    ),
]


def streaming_cases() -> list[tuple[str, list[speech_pb2.StreamingSynthesizeRequest], grpc.StatusCode, str]]:
    S = speech_pb2.StreamingSynthesizeRequest
    return [
        ("no messages", [], INVALID, "config: the stream ended before any message"),
        ("text before config", [S(text="hi")], INVALID, "config: the first message must carry config"),
        (
            "second config",
            [S(config=cfg()), S(text="hi"), S(config=cfg())],
            grpc.StatusCode.FAILED_PRECONDITION,
            "config: config may only be sent once",
        ),
        (
            "flac stream",
            # Config alone: the server rejects it on arrival, and a write after that races the abort; grpc.aio
            # then reports INTERNAL instead of the server's status (grpc/grpc#36066; the SDK waits for
            # `started` for this reason).
            [S(config=cfg(encoding=speech_pb2.AUDIO_ENCODING_FLAC))],
            INVALID,
            "config.encoding: AUDIO_ENCODING_FLAC cannot be streamed",
        ),
        (
            "no text",
            [S(config=cfg()), S(flush=speech_pb2.Flush())],
            INVALID,
            "text: no text was sent before the end of input",
        ),
        (
            "deltas over limit",
            [S(config=cfg()), *[S(text="y" * 50)] * 5],
            INVALID,
            "text: 250 characters exceeds the limit of 200",
        ),
        ("empty message", [S(config=cfg()), S()], INVALID, "request: empty message"),
    ]


async def run_stream(stack: Stack, requests: list[Any]) -> tuple[grpc.StatusCode, str]:
    async def gen() -> AsyncIterator[Any]:
        for r in requests:
            yield r

    try:
        async for _ in stack.stub.StreamingSynthesize(gen()):
            pass
    except grpc.aio.AioRpcError as exc:
        return exc.code(), exc.details() or ""
    return OK, ""


HTTP_CASES: list[tuple[str, Any, int, str | None, str]] = [
    ("invalid json", b"{not json", 400, "body", "invalid JSON"),
    ("missing input", {"voice": "serena"}, 400, "input", "required"),
    ("unknown parameter", {"input": "hi", "volume": 3}, 400, "volume", "unknown parameter"),
    ("wrong type", {"input": "hi", "temperature": "hot"}, 400, "temperature", "temperature"),
    ("empty input", {"input": ""}, 400, "input", "must not be empty"),
    ("input over limit", {"input": "z" * (LIMIT + 1)}, 400, "input", "exceeds the limit"),
    ("unknown voice", {"input": "hi", "voice": "nobody"}, 404, "voice", "voice 'nobody' does not exist"),
    ("unknown model", {"input": "hi", "model": "tts-1"}, 404, "model", "not served here"),
    (
        "bad format",
        {"input": "hi", "response_format": "aac"},
        400,
        "response_format",
        "unsupported audio format",
    ),
    (
        "flac stream",
        {"input": "hi", "stream": True, "response_format": "flac"},
        400,
        "response_format",
        "cannot be streamed",
    ),
    (
        "sse without streaming",
        {"input": "hi", "stream": False, "stream_format": "sse"},
        400,
        "stream_format",
        "needs streaming",
    ),
    ("bad sample rate", {"input": "hi", "sample_rate": 96_000}, 400, "sample_rate", "got 96000"),
    ("speed", {"input": "hi", "speed": 2.0}, 400, "speed", "only 1.0"),
    ("negative seed", {"input": "hi", "seed": -1}, 400, "seed", "must be in [0, 2**63), got -1"),
    ("bad temperature", {"input": "hi", "temperature": -1.0}, 400, "temperature", "must be in [0, 100]"),
    ("unsupported language", {"input": "hi", "language": "xx"}, 400, "language", "not supported"),
    (
        "ref_audio on a preset-voice model",
        {"input": "hi", "ref_audio": "%%%"},
        400,
        "ref_audio",
        "voice cloning",
    ),
    ("ref_text alone", {"input": "hi", "ref_text": "words"}, 400, "ref_text", "needs ref_audio"),
    (
        "body too large",
        {"input": "hi", "ref_audio": "A" * (15 * 1024 * 1024)},
        413,
        "body",
        "exceeds the limit",
    ),
]


# Judged on a voice-clone (base) model: (case, body fields, message).
REFERENCE_HTTP: list[tuple[str, dict[str, Any], str]] = [
    ("ref_audio not base64", {"ref_audio": "%%%"}, "not valid base64"),
    ("ref_audio url", {"ref_audio": "https://example.com/a.wav"}, "URLs"),
    (
        "ref_audio garbage",
        {"ref_audio": base64.b64encode(b"garbage" * 20).decode()},
        "not a decodable audio file",
    ),
]


async def test_bad_inputs_table(make_stack: MakeStack) -> None:
    stack = await make_stack(FakeCodec(frame_delay_s=0.02), overrides=[f"gateway.max_text_chars={LIMIT}"])
    # A well-behaved stream runs through the whole table and must finish intact.
    bystander = asyncio.ensure_future(
        stack.stub.Synthesize(speech_pb2.SynthesizeRequest(config=cfg(), text="b" * 60))
    )
    await asyncio.sleep(0.05)
    opens_before = len(stack.codec.opens)
    failures: list[str] = []
    for name, config, text, code, message in UNARY:
        try:
            await stack.stub.Synthesize(speech_pb2.SynthesizeRequest(config=config, text=text))
            got, details = OK, ""
        except grpc.aio.AioRpcError as exc:
            got, details = exc.code(), exc.details() or ""
        if got is not code or message not in details:
            failures.append(f"unary {name}: {got.name} {details!r}")
    for name, requests, code, message in streaming_cases():
        got, details = await run_stream(stack, requests)
        if got is not code or message not in details:
            failures.append(f"stream {name}: {got.name} {details!r}")
    async with httpx.AsyncClient(base_url=stack.http_url) as http:
        for name, body, status, param, message in HTTP_CASES:
            if isinstance(body, bytes):
                r = await http.post(
                    "/v1/audio/speech", content=body, headers={"content-type": "application/json"}
                )
            else:
                r = await http.post("/v1/audio/speech", json=body)
            err = r.json().get("error", {}) if r.headers.get("content-type") == "application/json" else {}
            if r.status_code != status or err.get("param") != param or message not in err.get("message", ""):
                failures.append(f"http {name}: {r.status_code} {r.text[:200]}")
            elif err.get("type") != "invalid_request_error" or not err.get("code"):
                failures.append(f"http {name}: not OpenAI's error shape: {err}")
    assert not failures, "\n".join(failures)
    assert len(UNARY) + len(streaming_cases()) + len(HTTP_CASES) >= 15
    # Only the four stream cases whose fault shows after the config (second config, no text, too much text,
    # empty message) reached a codec, and each of those streams was cancelled there.
    assert len(stack.codec.opens) - opens_before == 4
    assert stack.codec.cancels == 4
    reply = await bystander
    assert len(reply.audio) == 2 * expected_samples("b" * 60)


async def test_talker_error_is_relayed_when_the_gateway_cannot_judge(make_stack: MakeStack) -> None:
    # The talker reports no catalog (one older than it), so the voice goes to the talker; its NOT_FOUND comes
    # back.
    stack = await make_stack(talker=FakeTalker(model="/models/not-mounted", catalog=None))
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stack.stub.Synthesize(speech_pb2.SynthesizeRequest(config=cfg(voice="nobody"), text="hi"))
    assert err.value.code() is grpc.StatusCode.NOT_FOUND
    assert "speaker" in (err.value.details() or "") and "(from talker)" in (err.value.details() or "")
    voices = await stack.stub.ListVoices(speech_pb2.ListVoicesRequest())
    assert (
        len(voices.voices) == 1
        and voices.voices[0].name == ""
        and "unavailable" in voices.voices[0].description
    )


async def test_voice_clone_model_rules(make_stack: MakeStack, cache: Any) -> None:
    stack = await make_stack(talker=FakeTalker(model="qwen3-tts-tiny-base", catalog=catalog("base")))
    cases = [
        (cfg(), "needs reference audio"),
        (cfg(voice="serena", reference_audio=ref(data=wav_bytes(1.0))), "has no preset voices"),
        (cfg(instructions="cheerful", reference_audio=ref(data=wav_bytes(1.0))), "takes no instructions"),
    ]
    cases += [(cfg(reference_audio=reference), message) for _, reference, message in REFERENCE_UNARY]
    for config, message in cases:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stack.stub.Synthesize(speech_pb2.SynthesizeRequest(config=config, text="hi"))
        assert err.value.code() is INVALID and message in (err.value.details() or ""), err.value.details()
    async with httpx.AsyncClient(base_url=stack.http_url) as http:
        for name, body, message in REFERENCE_HTTP:
            r = await http.post("/v1/audio/speech", json={"input": "hi", **body})
            err = r.json()["error"]
            assert (r.status_code, err["param"]) == (400, "ref_audio") and message in err["message"], (
                name,
                err,
            )
    clip = np.sin(np.arange(16_000) / 10).astype(np.float32) * 0.5
    buf = io.BytesIO()
    sf.write(buf, clip, 16_000, format="WAV")
    reply = await stack.stub.Synthesize(
        speech_pb2.SynthesizeRequest(
            config=cfg(reference_audio=ref(data=buf.getvalue(), text="a transcript")), text="clone me"
        )
    )
    assert len(reply.audio) == 2 * expected_samples("clone me")
    sent = stack.codec.opens[-1].reference
    assert sent.audio_sample_rate_hz == 16_000 and sent.text == "a transcript"
    np.testing.assert_allclose(np.frombuffer(sent.audio.inline, "<f4"), clip, atol=1e-4)
    async with httpx.AsyncClient(base_url=stack.http_url) as http:
        data_url = "data:audio/wav;base64," + base64.b64encode(buf.getvalue()).decode()
        r = await http.post(
            "/v1/audio/speech",
            json={"input": "clone me", "response_format": "pcm", "ref_audio": data_url, "ref_text": "t"},
        )
        assert r.status_code == 200 and len(r.content) == 2 * expected_samples("clone me")
