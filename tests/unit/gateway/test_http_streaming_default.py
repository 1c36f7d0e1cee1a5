"""``POST /v1/audio/speech`` streams by default, as OpenAI's endpoint does: the official client's
``with_streaming_response`` gets its first bytes while the clip is still being made, in every format that
streams by default; ``stream: false`` still gets the whole clip in one response, and so does WAV unless the
request says ``stream: true`` (issue 29: a streamed WAV cannot state its sizes)."""

from __future__ import annotations

import base64
import io
import json
import time
import wave

import httpx
import numpy as np
import pytest
import soundfile as sf
from gateway_fakes import SAMPLE_RATE, FakeCodec, expected_samples
from gateway_kit import MakeStack
from openai import AsyncOpenAI

from voxstage import formats
from voxstage.audio import decode_audio

TEXT = "abcdefghijklmnop"  # 16 frames; at 50 ms a frame, about 0.8 s to make
FRAME_DELAY_S = 0.05


def _decode(data: bytes) -> np.ndarray:
    # decode_audio reads streams whose header states no length (unlike sf.read).
    pcm, rate = decode_audio(data, max_bytes=len(data) + 1, max_seconds=60.0)
    assert rate == SAMPLE_RATE
    return pcm


@pytest.mark.parametrize("fmt", [None, "mp3", "opus", "pcm", "mulaw", "alaw"])
async def test_openai_client_gets_first_bytes_before_the_clip_is_done(
    make_stack: MakeStack, fmt: str | None
) -> None:
    stack = await make_stack(FakeCodec(frame_delay_s=FRAME_DELAY_S))
    client = AsyncOpenAI(base_url=f"{stack.http_url}/v1", api_key="unused", max_retries=0)
    options = {} if fmt is None else {"response_format": fmt}  # None: OpenAI's default (mp3)
    start = time.monotonic()
    arrivals: list[float] = []
    chunks: list[bytes] = []
    async with client.audio.speech.with_streaming_response.create(
        model="qwen3-tts-tiny",
        voice="serena",
        input=TEXT,
        **options,  # type: ignore[arg-type]
    ) as response:
        assert response.headers["content-type"].startswith(formats.BY_NAME[fmt or "mp3"].content_type)
        assert "content-length" not in response.headers  # chunked: sent as it is made
        async for chunk in response.iter_bytes():
            arrivals.append(time.monotonic() - start)
            chunks.append(chunk)
    await client.close()
    generation_s = len(TEXT) * FRAME_DELAY_S
    assert arrivals[0] < generation_s / 2, (arrivals[0], arrivals[-1])  # well before the clip ends
    assert arrivals[-1] > generation_s * 0.8
    data = b"".join(chunks)
    if fmt in ("pcm", "mulaw", "alaw"):  # headerless: 2 or 1 bytes a sample
        assert len(data) == (2 if fmt == "pcm" else 1) * expected_samples(TEXT)
        return
    pcm = _decode(data)
    # mp3 adds the encoder's delay and one silent leading frame; opus is exact.
    assert expected_samples(TEXT) <= len(pcm) <= expected_samples(TEXT) + 3000


async def test_stream_false_and_flac_get_the_whole_clip(make_stack: MakeStack) -> None:
    stack = await make_stack()
    async with httpx.AsyncClient(base_url=stack.http_url) as http:
        for body in (
            {"input": TEXT, "stream": False},  # mp3, whole
            {"input": TEXT, "response_format": "flac"},  # cannot stream: sent whole by default
            {"input": TEXT, "response_format": "wav"},  # streams only when asked: whole by default
        ):
            r = await http.post("/v1/audio/speech", json=body)
            assert r.status_code == 200, r.text
            assert int(r.headers["content-length"]) == len(r.content)
            assert "x-request-id" in r.headers  # only a whole clip knows its id before its first byte
            pcm, rate = sf.read(io.BytesIO(r.content), dtype="float32")  # the header states the length
            assert rate == SAMPLE_RATE and abs(len(pcm) - expected_samples(TEXT)) < 2000
        with wave.open(io.BytesIO(r.content)) as w:  # the WAV's RIFF and data sizes are exact
            assert w.getnframes() == expected_samples(TEXT) == (len(r.content) - 44) // 2
        assert int.from_bytes(r.content[4:8], "little") == len(r.content) - 8
        r = await http.post(
            "/v1/audio/speech", json={"input": TEXT, "stream": True, "response_format": "flac"}
        )
        assert r.status_code == 400 and r.json()["error"]["param"] == "response_format"
        assert "drop stream" in r.json()["error"]["message"]
        # A caller that asks for streaming without a format keeps the raw pcm it always got.
        r = await http.post("/v1/audio/speech", json={"input": TEXT, "stream": True})
        assert r.headers["content-type"].startswith("audio/pcm;rate=24000")
        assert len(r.content) == 2 * expected_samples(TEXT)
        r = await http.post(
            "/v1/audio/speech", json={"input": TEXT, "response_format": "mp3", "sample_rate": 9000}
        )
        assert r.status_code == 400 and r.json()["error"]["param"] == "sample_rate"
        assert "mp3 supports" in r.json()["error"]["message"]


async def test_sse_still_streams_events(make_stack: MakeStack) -> None:
    stack = await make_stack()
    async with httpx.AsyncClient(base_url=stack.http_url) as http:
        body = {"input": TEXT, "stream_format": "sse", "response_format": "mp3"}
        async with http.stream("POST", "/v1/audio/speech", json=body) as r:
            assert r.headers["content-type"].startswith("text/event-stream")
            lines = [line async for line in r.aiter_lines() if line.startswith("data: ")]
    events = [json.loads(line[6:]) for line in lines]
    assert events[-1]["type"] == "speech.audio.done"
    audio = b"".join(base64.b64decode(e["audio"]) for e in events[:-1])
    assert len(_decode(audio)) >= expected_samples(TEXT)
