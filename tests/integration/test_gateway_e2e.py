"""End to end through the real stack: talker, codec and gateway started with docker-compose.yml's own
commands and healthchecks, on the tiny Qwen3-TTS preset (CPU). Every public surface gets audio whose
length matches what the talker generated; bad input gets the right code through the real stages.

Requests cap ``max_frames``: the tiny preset has random weights and rarely says end-of-speech.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import re
import shutil
import socket
import subprocess
from pathlib import Path

import grpc
import httpx
import numpy as np
import pytest
import soundfile as sf
from openai import OpenAI

from tests.integration import tcpkit
from tests.integration.deploykit import ComposeStack
from voxstage.client import AsyncSpeechClient, SpeechClient, SpeechError
from voxstage.v1 import speech_pb2, speech_pb2_grpc

SPF = 1920  # samples per 12.5 Hz frame at 24 kHz
FRAMES = 6
STAGES = ("talker", "codec")


@pytest.fixture(scope="module")
def stack(compose_stack: ComposeStack) -> ComposeStack:
    return compose_stack  # the session's compose stack (tests/integration/conftest.py), shared


def pcm_config(**kw: object) -> speech_pb2.SynthesisConfig:
    config = speech_pb2.SynthesisConfig(encoding=speech_pb2.AUDIO_ENCODING_PCM_S16LE, **kw)  # type: ignore[arg-type]
    config.sampling.max_frames = FRAMES
    return config


def test_health_probe_and_voices(stack: ComposeStack) -> None:
    assert all(p.healthy() for p in stack.procs.values())
    voices = httpx.get(f"{stack.http_url}/v1/audio/voices").json()["voices"]
    assert "vivian" in [v["name"] for v in voices]  # read from the materialized preset's config.json
    models = httpx.get(f"{stack.http_url}/v1/models").json()["data"]
    assert [m["id"] for m in models] == ["qwen3-tts-tiny"]


async def test_raw_grpc_unary_and_streaming(stack: ComposeStack) -> None:
    async with grpc.aio.insecure_channel(stack.grpc_addr) as channel:
        stub = speech_pb2_grpc.SpeechStub(channel)
        reply = await stub.Synthesize(
            speech_pb2.SynthesizeRequest(config=pcm_config(voice="ryan"), text="Hi.")
        )
        summary = reply.summary
        assert 1 <= summary.frame_count <= FRAMES
        assert len(reply.audio) // 2 == summary.sample_count == summary.frame_count * SPF

        async def requests():  # type: ignore[no-untyped-def]
            yield speech_pb2.StreamingSynthesizeRequest(config=pcm_config(sample_rate_hz=16_000))
            yield speech_pb2.StreamingSynthesizeRequest(text="Streaming ")
            yield speech_pb2.StreamingSynthesizeRequest(text="works.")

        replies = [r async for r in stub.StreamingSynthesize(requests())]
    started = replies[0].started
    assert started.sample_rate_hz == 16_000 and started.encoding == speech_pb2.AUDIO_ENCODING_PCM_S16LE
    audio = b"".join(r.audio.data for r in replies if r.HasField("audio"))
    summary = replies[-1].summary
    assert len(audio) // 2 == summary.sample_count
    assert abs(summary.sample_count - summary.frame_count * SPF * 2 // 3) <= 2


async def test_pcm_comes_through_shared_memory(stack: ComposeStack) -> None:
    # The seed's SharedMemoryConnector moves payloads above 64 KiB through shm: a 9-frame f32 chunk is 69 KiB.
    # The request rides the gateway's link to the codec (docs/protocol.md §12), so the chunk crosses in the
    # slab of its tick.
    def sample(name: str, labels: str = "") -> float:
        text = httpx.get(stack.metrics_url("codec")).text
        key = re.escape(f"{name}{{{labels}}}" if labels else name)
        found = re.search(rf"^{key} (\S+)$", text, re.M)
        return float(found.group(1)) if found else 0.0

    def shm_bytes() -> float:
        return sample("voxstage_transport_bytes_total", 'path="shm"')

    batches = sample("voxstage_link_batches_total", 'end="upstream"')
    before = shm_bytes()
    config = pcm_config()
    config.sampling.max_frames = 10
    config.chunk_schedule.initial_chunk_frames = 9
    config.chunk_schedule.steady_chunk_frames = 9
    async with grpc.aio.insecure_channel(stack.grpc_addr) as channel:
        reply = await speech_pb2_grpc.SpeechStub(channel).Synthesize(
            speech_pb2.SynthesizeRequest(config=config, text="Through shared memory, please.")
        )
    assert len(reply.audio) // 2 == reply.summary.frame_count * SPF
    assert sample("voxstage_link_batches_total", 'end="upstream"') > batches
    if reply.summary.frame_count >= 9:  # the random model may end early, leaving the chunk small
        assert shm_bytes() - before >= 9 * SPF * 4
    for _ in range(100):  # the gateway acks the slab in its next batch, right after it copied it out
        if sample("voxstage_shm_slots_lent") == 0:
            break
        await asyncio.sleep(0.02)
    assert sample("voxstage_shm_slots_lent") == 0


async def test_sdk_async_and_sync(stack: ComposeStack) -> None:
    async with AsyncSpeechClient(stack.grpc_addr) as client:
        audio = await client.synthesize("Async.", encoding="wav", max_frames=FRAMES, seed=3)
        assert audio.sample_rate == 24_000 and 0 < len(audio.to_numpy()) <= FRAMES * SPF
        again = await client.synthesize("Async.", encoding="wav", max_frames=FRAMES, seed=3)
        np.testing.assert_array_equal(again.to_numpy(), audio.to_numpy())  # a seeded request repeats
        session = client.session(encoding="pcm", max_frames=FRAMES)
        await session.push_text("Pushed text.")
        await session.end_input()
        chunks = [c async for c in session]
        assert session.summary is not None
        assert sum(len(c.data) for c in chunks) // 2 == session.summary.sample_count > 0

    def sync() -> int:
        with SpeechClient(stack.grpc_addr) as sync_client:
            return len(sync_client.synthesize_streamed("Sync.", max_frames=FRAMES).to_numpy())

    assert 0 < await asyncio.to_thread(sync) <= FRAMES * SPF


def test_http_pcm_wav_sse_and_openai(stack: ComposeStack) -> None:
    base = {"input": "Over HTTP.", "voice": "serena", "max_frames": FRAMES}
    with httpx.Client(base_url=stack.http_url, timeout=120) as http:
        pcm = http.post("/v1/audio/speech", json={**base, "response_format": "pcm"})
        assert pcm.status_code == 200 and 0 < len(pcm.content) // 2 <= FRAMES * SPF
        wav = http.post("/v1/audio/speech", json={**base, "response_format": "wav", "sample_rate": 8000})
        data, rate = sf.read(io.BytesIO(wav.content))
        assert rate == 8000 and 0 < len(data) <= FRAMES * SPF // 3 + 2
        with http.stream("POST", "/v1/audio/speech", json={**base, "stream_format": "sse"}) as r:
            events = [json.loads(x[6:]) for x in r.iter_lines() if x.startswith("data: ")]
        assert events[-1]["type"] == "speech.audio.done"
        audio = b"".join(base64.b64decode(e["audio"]) for e in events if e["type"] == "speech.audio.delta")
        assert len(audio) // 2 == events[-1]["voxstage"]["frames"] * SPF
    client = OpenAI(base_url=f"{stack.http_url}/v1", api_key="unused", max_retries=0)
    reply = client.audio.speech.create(
        model="qwen3-tts-tiny", voice="vivian", input="The OpenAI client.", response_format="wav",
        extra_body={"max_frames": FRAMES},
    )  # fmt: skip
    data, rate = sf.read(io.BytesIO(reply.content))
    assert rate == 24_000 and 0 < len(data) <= FRAMES * SPF


async def test_bad_input_through_the_real_stages(stack: ComposeStack) -> None:
    async with AsyncSpeechClient(stack.grpc_addr) as client:
        cases = [
            # uint64 on the wire, 63 bits in the samplers: refused at the edge, in the talker's words.
            ({"seed": 2**63}, grpc.StatusCode.INVALID_ARGUMENT, "seed: must be in [0, 2**63)"),
            ({"voice": "nobody"}, grpc.StatusCode.NOT_FOUND, "voice 'nobody'"),
            ({"language": "klingon"}, grpc.StatusCode.INVALID_ARGUMENT, "config.language"),
            ({"temperature": -1.0}, grpc.StatusCode.INVALID_ARGUMENT, "config.sampling.temperature"),
        ]
        for options, code, message in cases:
            with pytest.raises(SpeechError) as err:
                await client.synthesize("Bad.", encoding="pcm", **{"max_frames": FRAMES, **options})
            assert err.value.code is code and message in err.value.message, (options, err.value)
            assert "(from talker)" not in err.value.message  # all refused at the edge, before any stage
        # The stages are unharmed: the next request is served.
        assert len((await client.synthesize("Fine.", encoding="pcm", max_frames=FRAMES)).data) > 0


def test_metrics_on_every_process(stack: ComposeStack) -> None:
    text = httpx.get(stack.metrics_url("gateway")).text
    assert 'voxstage_time_to_first_audio_seconds_count{api="grpc_synthesize"}' in text
    count = [ln for ln in text.splitlines() if ln.startswith("voxstage_time_to_first_audio_seconds_count")]
    assert sum(float(ln.split()[-1]) for ln in count) > 0
    promtool = shutil.which("promtool")
    for stage in ("gateway", "talker", "codec"):
        body = httpx.get(stack.metrics_url(stage)).text
        assert "voxstage_" in body
        if promtool is not None:
            run = subprocess.run([promtool, "check", "metrics"], input=body, capture_output=True, text=True)
            assert run.returncode == 0, f"{stage}: {run.stdout}{run.stderr}"


def test_tcp_nodelay_on_every_socket(stack: ComposeStack) -> None:
    """Issue 29: with Nagle on, a kept-alive HTTP client's first audio waited ~40 ms for a delayed ACK. Every
    socket the three processes listen on hands out connections with TCP_NODELAY, and so do their links."""
    pids = {name: p.proc.pid for name, p in stack.procs.items()}
    ports = stack.ports
    listens = {s: {ports[s]["--port"]: "grpc", ports[s]["--metrics-port"]: "metrics"} for s in STAGES}
    listens["gateway"] = {ports["gateway"]["--grpc-port"]: "grpc", ports["gateway"]["--http-port"]: "http"}
    for name, pid in pids.items():
        assert tcpkit.listening_ports(pid) == set(listens[name]), name  # nothing listens that is not tested
    with SpeechClient(stack.grpc_addr) as client:  # the stage links carry a request
        assert len(client.synthesize("Links.", encoding="pcm", max_frames=2).data) > 0
    clients = []
    problems = []
    try:
        for name, by_port in listens.items():
            for port, kind in by_port.items():
                if kind == "http":  # a kept-alive connection after a whole request, as a user's client has
                    sock = tcpkit.http_get(port, "/health")
                elif kind == "grpc":
                    sock = tcpkit.h2_preface(port)
                else:  # the metrics server is HTTP/1.0: an open connection whose request is still coming
                    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
                clients.append(sock)
                problems.append(tcpkit.accepted_nodelay(pids[name], port, sock.getsockname()[1]))
        links = {name: [c.remote_port for c in tcpkit.established(pid)] for name, pid in pids.items()}
        for name, pid in pids.items():
            for conn in tcpkit.established(pid):
                fd = tcpkit.socket_fds(pid).get(conn.inode)
                if fd is not None and tcpkit.nodelay(pid, fd) is False:
                    problems.append(f"{name}: {conn.local_port} -> {conn.remote_port} has Nagle on")
    finally:
        for sock in clients:
            sock.close()
    assert [p for p in problems if p] == []
    # The links themselves were seen: gateway -> codec and talker, codec -> talker.
    assert {ports["codec"]["--port"], ports["talker"]["--port"]} <= set(links["gateway"]), links
    assert ports["talker"]["--port"] in links["codec"], links


def test_logs_have_no_tracebacks(stack: ComposeStack) -> None:
    for proc in stack.procs.values():
        assert "Traceback" not in Path(proc.log).read_text(errors="replace"), proc.tail()
