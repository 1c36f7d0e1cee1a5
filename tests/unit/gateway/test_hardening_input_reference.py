"""Reference audio cannot make the gateway decode more than it accepts (issue 15: a 0.7 MB FLAC holding an
hour of 48 kHz stereo silence was decoded whole on the event loop, 2 GB, before the 60 s limit was checked;
also for models that take no reference; and the decoded arrays outlived the refusal)."""

from __future__ import annotations

import base64
import gc
import io
import threading
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import pytest
import soundfile as sf
from gateway_fakes import FakeTalker, expected_samples
from gateway_kit import MakeStack, catalog

import gateway.tts.request as request_module
from voxstage.audio import AudioError, decode_audio
from voxstage.v1 import speech_pb2

BASE = "qwen3-tts-tiny-base"
RATE = 8000  # an hour of 48 kHz stereo takes 6 s to encode here; 8 kHz mono makes the same point in 0.3 s


def flac(seconds: float, *, rate: int = RATE, hide_length: bool = False) -> bytes:
    """Silence as FLAC, written a minute at a time (small on disk, large decoded)."""
    buf = io.BytesIO()
    minute = np.zeros(rate * 60, np.int16)
    with sf.SoundFile(buf, "w", rate, 1, format="FLAC", subtype="PCM_16") as f:
        for _ in range(int(seconds // 60)):
            f.write(minute)
        f.write(np.zeros(int(seconds % 60 * rate), np.int16))
    data = bytearray(buf.getvalue())
    if hide_length:  # STREAMINFO's 36-bit total sample count 0: "unknown"
        data[8 + 13] &= 0xF0
        data[8 + 14 : 8 + 18] = b"\0\0\0\0"
    return bytes(data)


@pytest.fixture(scope="module")
def hour() -> bytes:
    data = flac(3600)
    assert len(data) < 200_000  # an hour of audio in under 0.2 MB
    return data


@pytest.fixture
def no_decoding(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Any attempt to decode samples fails the request (and so the test)."""

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("samples were decoded")

    monkeypatch.setattr(sf.SoundFile, "read", refuse)
    monkeypatch.setattr(sf, "read", refuse)
    yield


async def _base_stack(make_stack: MakeStack, cache: Path) -> Any:
    return await make_stack(talker=FakeTalker(model=BASE, catalog=catalog("base")))


def _grpc_request(data: bytes) -> speech_pb2.SynthesizeRequest:
    ref = speech_pb2.ReferenceAudio(data=data, encoding=speech_pb2.AUDIO_ENCODING_WAV, text="t")
    config = speech_pb2.SynthesisConfig(encoding=speech_pb2.AUDIO_ENCODING_PCM_S16LE, reference_audio=ref)
    return speech_pb2.SynthesizeRequest(config=config, text="hi")


async def test_an_hour_of_flac_is_refused_from_its_header(
    make_stack: MakeStack, cache: Path, hour: bytes, no_decoding: None
) -> None:
    stack = await _base_stack(make_stack, cache)
    async with httpx.AsyncClient(base_url=stack.http_url) as http:
        r = await http.post(
            "/v1/audio/speech", json={"input": "hi", "ref_audio": base64.b64encode(hour).decode()}
        )
    err = r.json()["error"]
    assert (r.status_code, err["param"]) == (400, "ref_audio"), r.text
    assert err["message"] == "ref_audio: 3600.0 s exceeds the limit of 60 s"
    # gRPC's WAV reference is read by the same sniffing decoder.
    with pytest.raises(grpc.aio.AioRpcError) as rpc:
        await stack.stub.Synthesize(_grpc_request(hour))
    assert rpc.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert rpc.value.details() == "config.reference_audio.data: 3600.0 s exceeds the limit of 60 s"
    assert stack.codec.opens == []


async def test_a_model_without_voice_clone_refuses_a_reference_before_parsing_it(
    make_stack: MakeStack, hour: bytes, monkeypatch: pytest.MonkeyPatch, no_decoding: None
) -> None:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the reference was parsed")

    monkeypatch.setattr(request_module, "decode_audio", refuse)
    monkeypatch.setattr(sf, "SoundFile", refuse)
    monkeypatch.setattr(sf, "info", refuse)
    stack = await make_stack()  # qwen3-tts-tiny, custom_voice: preset voices only
    async with httpx.AsyncClient(base_url=stack.http_url) as http:
        r = await http.post(
            "/v1/audio/speech", json={"input": "hi", "ref_audio": base64.b64encode(hour).decode()}
        )
    err = r.json()["error"]
    assert (r.status_code, err["param"], err["code"]) == (400, "ref_audio", "voice_clone_not_supported")
    with pytest.raises(grpc.aio.AioRpcError) as rpc:
        await stack.stub.Synthesize(_grpc_request(hour))
    assert rpc.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert (
        "config.reference_audio.data: model 'qwen3-tts-tiny' (custom_voice) does not support voice cloning"
        in (rpc.value.details() or "")
    )


async def test_a_reference_is_decoded_off_the_event_loop(
    make_stack: MakeStack, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    threads: list[bool] = []

    def spy(*args: Any, **kwargs: Any) -> Any:
        threads.append(threading.current_thread() is threading.main_thread())
        return decode_audio(*args, **kwargs)

    monkeypatch.setattr(request_module, "decode_audio", spy)
    stack = await _base_stack(make_stack, cache)
    clip = flac(5.0, rate=16_000)
    async with httpx.AsyncClient(base_url=stack.http_url) as http:
        r = await http.post(
            "/v1/audio/speech",
            json={"input": "clone", "response_format": "pcm", "ref_audio": base64.b64encode(clip).decode()},
        )
    assert r.status_code == 200 and len(r.content) == 2 * expected_samples("clone")
    reply = await stack.stub.Synthesize(_grpc_request(clip))
    assert reply.audio
    assert threads == [False, False]  # both decoded in a worker thread, not on the loop


def test_decoding_stops_at_the_cap_when_the_header_hides_the_length() -> None:
    data = flac(70, hide_length=True)
    tracemalloc.start()
    try:
        with pytest.raises(AudioError, match="exceeds the limit of 60 s"):
            decode_audio(data)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 61 * RATE * 4 * 1.5  # about the cap's mono buffer, never the whole clip


def test_an_hour_is_refused_without_allocating_it(hour: bytes) -> None:
    tracemalloc.start()
    try:
        with pytest.raises(AudioError, match="3600.0 s exceeds the limit of 60 s"):
            decode_audio(hour)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1_000_000  # the whole hour would be 115 MB at 8 kHz mono (2 GB at 48 kHz stereo)


def _nan_wav(seconds: float, rate: int = 16_000) -> bytes:
    pcm = np.zeros(int(seconds * rate), np.float32)
    pcm[-1] = np.nan
    buf = io.BytesIO()
    sf.write(buf, pcm, rate, format="WAV", subtype="FLOAT")
    return buf.getvalue()


def _decoder_bytes(snapshot: tracemalloc.Snapshot) -> int:
    traces = snapshot.filter_traces(
        [tracemalloc.Filter(True, "*soundfile.py"), tracemalloc.Filter(True, "*voxstage/audio.py")]
    )
    return sum(stat.size for stat in traces.statistics("filename"))


async def test_refused_audio_is_freed_at_once(make_stack: MakeStack, cache: Path) -> None:
    stack = await _base_stack(make_stack, cache)
    data = _nan_wav(30.0)  # decodes to 1.9 MB of float32, then is refused
    gc.collect()
    gc.disable()  # what is not freed by reference counting stays: issue 15's arrays waited for a GC cycle
    tracemalloc.start()
    try:
        async with httpx.AsyncClient(base_url=stack.http_url) as http:
            r = await http.post(
                "/v1/audio/speech", json={"input": "hi", "ref_audio": base64.b64encode(data).decode()}
            )
        with pytest.raises(grpc.aio.AioRpcError):
            await stack.stub.Synthesize(_grpc_request(data))
        held = _decoder_bytes(tracemalloc.take_snapshot())
        with pytest.raises(AudioError) as kept:  # a caller that keeps the error keeps no samples either
            decode_audio(data)
        held_by_error = _decoder_bytes(tracemalloc.take_snapshot())
    finally:
        tracemalloc.stop()
        gc.enable()
    assert r.status_code == 400 and "NaN" in r.json()["error"]["message"]
    assert "NaN" in str(kept.value)
    assert held < 100_000 and held_by_error < 100_000, (held, held_by_error)
