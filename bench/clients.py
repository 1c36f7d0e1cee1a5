"""Transports of the load generator: the gateway's public gRPC API (streaming and unary) and its HTTP face.

Each client turns one synthesis into an :class:`Outcome`: when the first request byte left, when each piece
of PCM arrived and how many bytes it held, and how the request ended. Raw stubs, not the SDK: the SDK holds
the text back until the server's ``started`` (one extra round trip, see ``voxstage.client._async``) and
retries refusals, and a benchmark must see both the fastest client path and every refusal.

HTTP uses one fresh connection per request, opened before the clock starts (connection set-up is not
time to first audio, as in Nari's methodology), and ``h11`` (a uvicorn dependency, so present wherever the
gateway runs) to find PCM bytes in the chunked body as soon as they arrive, partial chunks included.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import time
from dataclasses import dataclass
from typing import Any, Protocol

import grpc
import h11

from bench.records import Outcome
from voxstage.v1 import speech_pb2, speech_pb2_grpc

CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
    ("grpc.enable_retries", 0),  # a refusal must be counted, not retried behind our back
]
# Slack over the request deadline before the client gives up on its own (the server's DEADLINE_EXCEEDED
# normally arrives first).
LOCAL_SLACK_S = 5.0


@dataclass(frozen=True)
class Synthesis:
    text: str
    seed: int
    voice: str = "ryan"
    language: str = "english"
    model: str = ""
    max_frames: int | None = None
    initial_chunk_frames: int = 0  # gRPC only: 0 keeps the deploy file's schedule
    steady_chunk_frames: int = 0
    # gRPC only: a voice-clone clip sent with every request (a WAV file's bytes) and its transcript.
    reference_wav: bytes = b""
    reference_text: str = ""


class Client(Protocol):
    api: str

    async def connect(self, timeout_s: float) -> None: ...

    async def run(self, s: Synthesis, timeout_s: float) -> Outcome: ...

    async def aclose(self) -> None: ...


def _seconds(d: object) -> float:
    return float(d.seconds) + float(d.nanos) / 1e9  # type: ignore[attr-defined]


def synthesis_config(s: Synthesis) -> speech_pb2.SynthesisConfig:
    cfg = speech_pb2.SynthesisConfig(
        model=s.model,
        voice=s.voice,
        language=s.language,
        encoding=speech_pb2.AUDIO_ENCODING_PCM_S16LE,
        seed=s.seed,
    )
    if s.max_frames is not None:
        cfg.sampling.max_frames = s.max_frames
    if s.initial_chunk_frames or s.steady_chunk_frames:
        cfg.chunk_schedule.initial_chunk_frames = s.initial_chunk_frames
        cfg.chunk_schedule.steady_chunk_frames = s.steady_chunk_frames
    if s.reference_wav:
        cfg.reference_audio.data = s.reference_wav
        cfg.reference_audio.encoding = speech_pb2.AUDIO_ENCODING_WAV
        cfg.reference_audio.text = s.reference_text
    return cfg


class _GrpcBase:
    def __init__(self, address: str, channels: int = 1) -> None:
        self.address = address
        self._channels = [
            grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS) for _ in range(channels)
        ]
        self._stubs = [speech_pb2_grpc.SpeechStub(c) for c in self._channels]
        self._next = itertools.cycle(range(channels))

    async def connect(self, timeout_s: float) -> None:
        # Connected before the clock runs: channel set-up is not any request's latency.
        async with asyncio.timeout(timeout_s):
            await asyncio.gather(*(c.channel_ready() for c in self._channels))

    def stub(self) -> speech_pb2_grpc.SpeechStub:
        return self._stubs[next(self._next)]

    async def aclose(self) -> None:
        await asyncio.gather(*(c.close() for c in self._channels))

    @staticmethod
    async def read_stream(call: Any, out: Outcome, timeout_s: float) -> Outcome:
        """Read a ``StreamingSynthesize`` call to its end into ``out`` (audio arrival times, segments, the
        summary); a failure or a local timeout is recorded, not raised."""
        try:
            async with asyncio.timeout(timeout_s + LOCAL_SLACK_S):
                async for reply in call:
                    now = time.perf_counter()
                    kind = reply.WhichOneof("response")
                    if kind == "audio":
                        out.reads.append((now, len(reply.audio.data)))
                    elif kind == "segment_done" and out.segments is not None:
                        out.segments += 1
                    elif kind == "started":
                        out.sample_rate = reply.started.sample_rate_hz
                        out.request_id = reply.started.request_id
                    elif kind == "summary":
                        out.frames = int(reply.summary.frame_count)
                        out.server_ttfa_s = _seconds(reply.summary.time_to_first_audio)
            out.end = time.perf_counter()
            out.ok, out.code = True, "OK"
        except grpc.aio.AioRpcError as exc:
            out.code, out.detail = exc.code().name, exc.details() or ""
        except TimeoutError:
            call.cancel()
            out.code, out.detail = "TIMEOUT", f"no end of stream within {timeout_s + LOCAL_SLACK_S:.0f} s"
        except asyncio.CancelledError:
            call.cancel()
            raise
        return out


class GrpcStreamClient(_GrpcBase):
    """``StreamingSynthesize``: config and text are written at once, then the stream is half-closed."""

    api = "grpc"

    async def run(self, s: Synthesis, timeout_s: float) -> Outcome:
        requests = [
            speech_pb2.StreamingSynthesizeRequest(config=synthesis_config(s)),
            speech_pb2.StreamingSynthesizeRequest(text=s.text),
        ]
        out = Outcome(start=time.perf_counter())
        return await self.read_stream(
            self.stub().StreamingSynthesize(iter(requests), timeout=timeout_s), out, timeout_s
        )


class GrpcUnaryClient(_GrpcBase):
    """``Synthesize``: the whole clip in one response, so first audio is the end (no streaming)."""

    api = "grpc-unary"

    async def run(self, s: Synthesis, timeout_s: float) -> Outcome:
        request = speech_pb2.SynthesizeRequest(config=synthesis_config(s), text=s.text)
        out = Outcome(start=time.perf_counter())
        try:
            async with asyncio.timeout(timeout_s + LOCAL_SLACK_S):
                reply = await self.stub().Synthesize(request, timeout=timeout_s)
            out.end = time.perf_counter()
            out.reads.append((out.end, len(reply.audio)))
            out.sample_rate = reply.sample_rate_hz
            out.request_id = reply.summary.request_id
            out.frames = int(reply.summary.frame_count)
            out.server_ttfa_s = _seconds(reply.summary.time_to_first_audio)
            out.ok, out.code = True, "OK"
        except grpc.aio.AioRpcError as exc:
            out.code, out.detail = exc.code().name, exc.details() or ""
        except TimeoutError:
            out.code, out.detail = "TIMEOUT", f"no response within {timeout_s + LOCAL_SLACK_S:.0f} s"
        return out


def speech_body(s: Synthesis) -> bytes:
    body: dict[str, object] = {
        "model": s.model,
        "input": s.text,
        "voice": s.voice,
        "language": s.language,
        "response_format": "pcm",
        "stream": True,
        "seed": s.seed,
    }
    if s.max_frames is not None:
        body["max_frames"] = s.max_frames
    return json.dumps(body).encode()


class HttpStreamClient:
    """``POST /v1/audio/speech`` with ``stream: true`` and raw 16-bit PCM."""

    api = "http"

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port

    async def connect(self, timeout_s: float) -> None:
        async with asyncio.timeout(timeout_s):
            _, writer = await asyncio.open_connection(self.host, self.port)
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()

    async def aclose(self) -> None:
        return None

    async def run(self, s: Synthesis, timeout_s: float) -> Outcome:
        reader, writer = await asyncio.open_connection(self.host, self.port)
        conn = h11.Connection(h11.CLIENT)
        body = speech_body(s)
        head = h11.Request(
            method="POST",
            target="/v1/audio/speech",
            headers=[
                ("Host", f"{self.host}:{self.port}"),
                ("Content-Type", "application/json"),
                ("Content-Length", str(len(body))),
                ("Connection", "close"),
            ],
        )
        payload = conn.send(head) + conn.send(h11.Data(data=body)) + conn.send(h11.EndOfMessage())
        out = Outcome(start=time.perf_counter())
        try:
            async with asyncio.timeout(timeout_s):
                writer.write(payload)
                await writer.drain()
                await self._read(reader, conn, out)
        except TimeoutError:
            out.ok, out.code = False, "TIMEOUT"
            out.detail = f"response not complete within {timeout_s:.0f} s"
        except (h11.RemoteProtocolError, ConnectionError) as exc:
            out.ok, out.code, out.detail = False, "TRUNCATED", f"{type(exc).__name__}: {exc}"
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
        return out

    @staticmethod
    async def _read(reader: asyncio.StreamReader, conn: h11.Connection, out: Outcome) -> None:
        status = 0
        error_body = bytearray()
        while True:
            data = await reader.read(65536)
            now = time.perf_counter()
            conn.receive_data(data)  # b"" = EOF; h11 raises if the body was cut short
            while True:
                event = conn.next_event()
                if event is h11.NEED_DATA:
                    break
                if isinstance(event, h11.Response):
                    status = event.status_code
                    headers = {k.decode().lower(): v.decode() for k, v in event.headers}
                    out.sample_rate = int(headers.get("x-voxstage-sample-rate", "0") or 0)
                elif isinstance(event, h11.Data):
                    if status == 200:
                        out.reads.append((now, len(event.data)))
                    else:
                        error_body += event.data
                elif isinstance(event, h11.EndOfMessage):
                    out.end = now
                    if status == 200:
                        out.ok, out.code = True, "OK"
                    else:
                        out.code, out.detail = f"HTTP_{status}", _error_message(bytes(error_body))
                    return
                elif isinstance(event, h11.ConnectionClosed):
                    raise h11.RemoteProtocolError("connection closed before the response ended")


def _error_message(body: bytes) -> str:
    try:
        err = json.loads(body)["error"]
        return f"{err.get('code')}: {err.get('message')}"
    except (ValueError, KeyError, TypeError):
        return body[:200].decode(errors="replace")
