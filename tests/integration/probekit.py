"""Reliability probes against real stacks (issue 26): requests as a client sends them, raw enough to see the
exact status (no SDK retry in between), a steady load to check that other clients are served meanwhile,
and what counts as a server failure (a 5xx, or a gRPC code that says the server broke).
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import grpc
import httpx
import numpy as np
import soundfile as sf

from voxstage.v1 import speech_pb2, speech_pb2_grpc

if TYPE_CHECKING:
    from tests.integration.servekit import Served

# Codes a refused request may get: none of them says the server failed.
CLIENT_CODES = {
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.OUT_OF_RANGE,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
}
PCM = speech_pb2.AUDIO_ENCODING_PCM_S16LE
WAV = speech_pb2.AUDIO_ENCODING_WAV
# Large channels on the probe's side: the probes send what the gateway must refuse.
BIG = [("grpc.max_send_message_length", 256 << 20), ("grpc.max_receive_message_length", 256 << 20)]


def wav_bytes(seconds: float = 1.0, rate: int = 24_000) -> bytes:
    t = np.arange(int(seconds * rate)) / rate
    buf = io.BytesIO()
    sf.write(buf, (0.3 * np.sin(2 * np.pi * 180 * t)).astype(np.float32), rate, format="WAV")
    return buf.getvalue()


REF_WAV = wav_bytes()
REF_B64 = base64.b64encode(REF_WAV).decode()
Call = Callable[[speech_pb2_grpc.SpeechStub], object]


@dataclass
class Outcome:
    what: str
    status: int | grpc.StatusCode  # HTTP status or gRPC code
    detail: str = ""

    @property
    def server_failure(self) -> bool:
        if isinstance(self.status, int):
            return self.status >= 500
        return self.status not in CLIENT_CODES and self.status is not grpc.StatusCode.OK


def http_speech(base_url: str, what: str, body: dict[str, object], timeout: float = 60.0) -> Outcome:
    body = {"response_format": "pcm", "stream": False, **body}
    r = httpx.post(f"{base_url}/v1/audio/speech", json=body, timeout=timeout)
    return Outcome(what, r.status_code, r.text[:300] if r.status_code != 200 else f"{len(r.content)} bytes")


def grpc_call(addr: str, what: str, call: Call) -> Outcome:
    with grpc.insecure_channel(addr, options=BIG) as channel:
        try:
            call(speech_pb2_grpc.SpeechStub(channel))
        except grpc.RpcError as exc:
            return Outcome(what, exc.code(), exc.details() or "")  # type: ignore[attr-defined]
    return Outcome(what, grpc.StatusCode.OK)


def config(**fields: object) -> speech_pb2.SynthesisConfig:
    cfg = speech_pb2.SynthesisConfig(encoding=PCM)
    for name, value in fields.items():
        if name == "reference":
            cfg.reference_audio.data, cfg.reference_audio.encoding = REF_WAV, WAV
            cfg.reference_audio.text = str(value)
        elif name == "reference_bytes":  # a clip of this many bytes (not audio: refused before decoding)
            cfg.reference_audio.data, cfg.reference_audio.encoding = bytes(int(value)), WAV  # type: ignore[call-overload]
        elif name == "max_frames":
            cfg.sampling.max_frames = int(value)  # type: ignore[call-overload]
        else:
            setattr(cfg, name, value)
    return cfg


def synthesize(text: str, timeout: float = 60.0, **fields: object) -> Call:
    request = speech_pb2.SynthesizeRequest(config=config(**fields), text=text)
    return lambda stub: stub.Synthesize(request, timeout=timeout)


def streamed(deltas: list[str], timeout: float = 60.0, **fields: object) -> Call:
    """``StreamingSynthesize``: config, then ``deltas`` 50 ms apart, then a half-close; reads to the end."""

    def requests() -> Iterator[speech_pb2.StreamingSynthesizeRequest]:
        yield speech_pb2.StreamingSynthesizeRequest(config=config(**fields))
        for delta in deltas:
            yield speech_pb2.StreamingSynthesizeRequest(text=delta)
            time.sleep(0.05)

    return lambda stub: list(stub.StreamingSynthesize(requests(), timeout=timeout))


@dataclass
class Load:
    """``threads`` clients sending ``send()`` one after another until stopped; every outcome is kept."""

    send: Callable[[], Outcome]
    threads: int = 2
    outcomes: list[Outcome] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _workers: list[threading.Thread] = field(default_factory=list)

    def __enter__(self) -> Load:
        self._workers = [threading.Thread(target=self._loop, daemon=True) for _ in range(self.threads)]
        for w in self._workers:
            w.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for w in self._workers:
            w.join(90)
        assert not [w for w in self._workers if w.is_alive()], "a load client hangs"

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                outcome = self.send()
            except Exception as exc:  # noqa: BLE001 - recorded and judged by the test
                outcome = Outcome("load", 599, repr(exc))
            self.outcomes.append(outcome)

    def wait_for(self, n: int, limit_s: float = 60.0) -> None:
        deadline = time.monotonic() + limit_s
        while len(self.outcomes) < n:
            assert time.monotonic() < deadline, f"load made {len(self.outcomes)} requests in {limit_s} s"
            time.sleep(0.05)


CJK = "字"  # 3 UTF-8 bytes: 3 tokens of the tiny byte-level BPE


def tts_probes(served: Served, clone: bool) -> list[Outcome]:
    """Over-long text and reference transcripts, extreme max_frames and huge names, on HTTP and gRPC."""
    url, addr = served.http_url, served.grpc_addr
    clip = {"ref_audio": REF_B64}
    ref = {**clip, "ref_text": "a reference"} if clone else {}
    grpc_ref = {"reference": "a reference"} if clone else {}
    return [
        http_speech(url, "text under max_text_chars, over the window", {"input": CJK * 1400, **ref}),
        # Issue 26, defect 1: the transcript of a voice clone made the Qwen3-TTS talker exit.
        http_speech(url, "ref_text over the window", {"input": "hi", **clip, "ref_text": CJK * 1500}),
        http_speech(url, "text over max_text_chars", {"input": "a" * 5000, **ref}),
        http_speech(url, "max_frames 2**32-1", {"input": "hi", "max_frames": 2**32 - 1, **ref}),
        http_speech(url, "1 MB voice", {"input": "hi", "voice": "v" * 1_000_000, **ref}),
        # Issue 26, defect 1: 14 deltas of 100 CJK characters, each under the limit, crashed the talker.
        grpc_call(addr, "streamed text over the window", streamed([CJK * 100] * 14, **grpc_ref)),
        grpc_call(addr, "max_frames 100000", synthesize("hi", max_frames=100_000, **grpc_ref)),
        grpc_call(addr, "9000-character voice", synthesize("hi", voice="v" * 9000, **grpc_ref)),
        grpc_call(addr, "9000-character model", synthesize("hi", model="m" * 9000, **grpc_ref)),
        grpc_call(addr, "9000-character language", synthesize("hi", language="l" * 9000, **grpc_ref)),
    ]


def duplex_probes(served: Served) -> list[Outcome]:
    """A persona over the window and huge names, on both duplex faces; text-to-speech on a duplex model."""
    out = [http_speech(served.http_url, "text-to-speech on a duplex model", {"input": "hi"})]
    for what, session in (
        ("persona over the window", {"instructions": CJK * 4000}),
        ("9000-character voice", {"audio": {"output": {"voice": "v" * 9000}}}),
    ):
        out.append(asyncio.run(realtime_update(served, f"realtime: {what}", session)))
        out.append(converse_update(served, f"Converse: {what}", session))
    return out


async def realtime_update(served: Served, what: str, session: dict[str, object]) -> Outcome:
    import websockets

    async with websockets.connect(f"ws://{served.http_addr}/v1/realtime", max_size=None) as ws:
        await ws.recv()  # session.created
        await ws.send(json.dumps({"type": "session.update", "session": session}))
        event = json.loads(await asyncio.wait_for(ws.recv(), 10))
    if event["type"] != "error":
        return Outcome(what, 200, event["type"])
    error = event["error"]
    return Outcome(what, 400 if error["type"] == "invalid_request_error" else 500, error["message"])


def converse_update(served: Served, what: str, session: dict[str, object]) -> Outcome:
    msg = speech_pb2.Session(instructions=str(session.get("instructions", "")))
    if "audio" in session:
        msg.audio.output.voice = session["audio"]["output"]["voice"]  # type: ignore[index]

    def requests() -> Iterator[speech_pb2.ConverseRequest]:
        yield speech_pb2.ConverseRequest(session_update=speech_pb2.SessionUpdate(session=msg))
        time.sleep(1.0)

    with grpc.insecure_channel(served.grpc_addr) as channel:
        call = speech_pb2_grpc.SpeechStub(channel).Converse(requests(), timeout=20)
        events = [e for e in call if e.HasField("error") or e.HasField("session_updated")]
        code = call.code()
    error = next((e.error for e in events if e.HasField("error")), None)
    if error is None:
        return Outcome(what, 200, "session_updated")
    if code is not grpc.StatusCode.OK:
        return Outcome(what, code, error.message)
    # An in-band error leaves the call going (the client may fix the setting): its type is what counts.
    return Outcome(what, 500 if error.type == "server_error" else 400, error.message)


def tts_load(served: Served, clone: bool) -> Load:
    ref = {"reference": "a reference"} if clone else {}
    request = synthesize("hello there", seed=7, **ref)
    return Load(lambda: grpc_call(served.grpc_addr, "load", request))


def rss_mb(pid: int) -> float:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for {pid}")
