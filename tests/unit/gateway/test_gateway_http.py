"""The HTTP face: OpenAI-compatible speech (whole, raw stream, SSE), models, voices, health, metrics."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import shutil
from asyncio.subprocess import PIPE, STDOUT

import httpx
import numpy as np
import pytest
import soundfile as sf
from gateway_fakes import DROP_MARKER, expected_samples
from gateway_kit import SPEAKERS, MakeStack
from openai import AsyncOpenAI


async def test_speech_whole_clip_formats(make_stack: MakeStack) -> None:
    stack = await make_stack()
    text = "HTTP whole clip"
    async with httpx.AsyncClient(base_url=stack.http_url) as http:
        r = await http.post(
            "/v1/audio/speech",
            json={"model": "qwen3-tts-tiny", "input": text, "voice": "vivian", "response_format": "pcm"},
        )
        assert r.status_code == 200, r.text
        assert r.headers["content-type"].startswith("audio/pcm;rate=24000")
        assert len(r.content) == 2 * expected_samples(text)
        r = await http.post(
            "/v1/audio/speech", json={"input": text, "response_format": "wav", "sample_rate": 8000}
        )
        pcm, rate = sf.read(io.BytesIO(r.content), dtype="float32")
        assert r.headers["content-type"] == "audio/wav" and rate == 8000
        assert abs(len(pcm) - expected_samples(text) // 3) <= 2
        r = await http.post("/v1/audio/speech", json={"input": text})  # OpenAI's default: mp3
        assert r.status_code == 200 and r.headers["content-type"] == "audio/mpeg"
        mp3, rate = sf.read(io.BytesIO(r.content), dtype="float32")
        assert rate == 24_000 and abs(len(mp3) - expected_samples(text)) < 4000
        for fmt, magic in (("flac", b"fLaC"), ("opus", b"OggS")):
            r = await http.post("/v1/audio/speech", json={"input": text, "response_format": fmt})
            assert r.status_code == 200 and r.content[:4] == magic
        r = await http.post("/v1/audio/speech", json={"input": text, "response_format": "mulaw"})
        assert len(r.content) == expected_samples(text)  # one byte per sample


async def test_speech_raw_stream_and_sse(make_stack: MakeStack) -> None:
    stack = await make_stack()
    text = "streaming over http"
    async with httpx.AsyncClient(base_url=stack.http_url) as http:
        body = {"input": text, "stream": True, "response_format": "wav", "voice": {"id": "ryan"}}
        async with http.stream("POST", "/v1/audio/speech", json=body) as r:
            assert r.status_code == 200 and r.headers["content-type"] == "audio/wav"
            assert "content-length" not in r.headers  # chunked: sent as it is made
            pieces = [p async for p in r.aiter_raw()]
        data = b"".join(pieces)
        assert data[:4] == b"RIFF" and len(data) == 44 + 2 * expected_samples(text)
        # stream: true is the open-length WAV (docs/api.md): both sizes say "unknown".
        assert data[4:8] == data[40:44] == b"\xff\xff\xff\xff"
        assert stack.codec.opens[-1].voice == "ryan"

        body = {"input": text, "stream_format": "sse", "response_format": "pcm"}
        async with http.stream("POST", "/v1/audio/speech", json=body) as r:
            assert r.headers["content-type"].startswith("text/event-stream")
            lines = [line async for line in r.aiter_lines() if line.startswith("data: ")]
        events = [json.loads(line[6:]) for line in lines]
        assert {e["type"] for e in events[:-1]} == {"speech.audio.delta"}
        assert events[-1]["type"] == "speech.audio.done"
        audio = b"".join(base64.b64decode(e["audio"]) for e in events[:-1])
        assert len(audio) == 2 * expected_samples(text)


async def test_stream_failure_after_first_byte(make_stack: MakeStack) -> None:
    stack = await make_stack()
    async with httpx.AsyncClient(base_url=stack.http_url) as http:
        body = {"input": f"abc {DROP_MARKER}", "stream_format": "sse"}
        async with http.stream("POST", "/v1/audio/speech", json=body) as r:
            events = [json.loads(x[6:]) async for x in r.aiter_lines() if x.startswith("data: ")]
        assert events[0]["type"] == "speech.audio.delta"
        assert events[-1]["type"] == "error" and events[-1]["error"]["code"] == "codec_unavailable"
        # A raw stream is cut instead, so a truncated body never looks like a complete one.
        await stack.gateway.core.codecs.probe_all(force=True)
        with pytest.raises(httpx.RemoteProtocolError):
            async with http.stream(
                "POST", "/v1/audio/speech", json={"input": f"abc {DROP_MARKER}", "stream": True}
            ) as r:
                assert r.status_code == 200
                async for _ in r.aiter_raw():
                    pass


async def test_openai_client(make_stack: MakeStack) -> None:
    stack = await make_stack()
    client = AsyncOpenAI(base_url=f"{stack.http_url}/v1", api_key="unused", max_retries=0)
    text = "The official client works."
    reply = await client.audio.speech.create(
        model="qwen3-tts-tiny", voice="serena", input=text, response_format="wav"
    )
    pcm, rate = sf.read(io.BytesIO(reply.content), dtype="float32")
    assert rate == 24_000 and len(pcm) == expected_samples(text)
    async with client.audio.speech.with_streaming_response.create(
        model="qwen3-tts-tiny",
        voice="serena",
        input=text,
        response_format="pcm",
        extra_body={"stream": True, "sample_rate": 48_000, "seed": 7, "language": "english"},
    ) as streamed:
        data = b"".join([chunk async for chunk in streamed.iter_bytes()])
    assert abs(len(data) // 2 - 2 * expected_samples(text)) <= 4
    assert stack.codec.opens[-1].seed == 7 and stack.codec.opens[-1].language == "english"
    models = await client.models.list()
    assert [m.id for m in models.data] == ["qwen3-tts-tiny"]
    from openai import NotFoundError

    with pytest.raises(NotFoundError) as err:
        await client.audio.speech.create(model="tts-1", voice="serena", input=text)
    assert err.value.body["param"] == "model"  # type: ignore[index]
    await client.close()


async def test_voices_health_and_metrics(make_stack: MakeStack) -> None:
    stack = await make_stack()
    async with httpx.AsyncClient(base_url=stack.http_url) as http:
        voices = (await http.get("/v1/audio/voices")).json()["voices"]
        assert [v["name"] for v in voices] == SPEAKERS
        assert (await http.get("/health")).json()["status"] == "ok"
        r = await http.get("/nope")
        assert r.status_code == 404 and r.json()["error"]["type"] == "invalid_request_error"
        await http.post("/v1/audio/speech", json={"input": "count me", "response_format": "pcm"})
        metrics = (await http.get("/metrics")).text
    assert 'voxstage_requests_total{outcome="ok"}' in metrics
    assert "voxstage_time_to_first_audio_seconds_bucket" in metrics
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed")
    proc = await asyncio.create_subprocess_exec(
        promtool, "check", "metrics", stdin=PIPE, stdout=PIPE, stderr=STDOUT
    )
    out, _ = await proc.communicate(metrics.encode())
    assert proc.returncode == 0, out.decode()


async def test_health_follows_stage_readiness(make_stack: MakeStack) -> None:
    stack = await make_stack()
    stack.codec.ready = False
    await stack.gateway.core.codecs.probe_all(force=True)
    await stack.gateway.core._refresh()
    async with httpx.AsyncClient(base_url=stack.http_url) as http:
        r = await http.get("/health")
        assert r.status_code == 503 and r.json()["codec_ready"] is False
        r = await http.post("/v1/audio/speech", json={"input": "nobody home", "response_format": "pcm"})
        assert r.status_code == 503 and r.json()["error"]["param"] == "codec"
        assert int(r.headers["retry-after"]) >= 1
    np.testing.assert_equal(stack.codec.opens, [])
