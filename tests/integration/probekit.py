"""Reliability probes against real stacks (issue 26): requests as a client sends them, raw enough to see the
exact status (no SDK retry in between), a steady load to check that other clients are served meanwhile,
and what counts as a server failure (a 5xx, or a gRPC code that says the server broke).
"""

from __future__ import annotations

import base64
import io
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import grpc
import httpx
import numpy as np
import soundfile as sf

from voxstage.v1 import speech_pb2, speech_pb2_grpc

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


def rss_mb(pid: int) -> float:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for {pid}")
