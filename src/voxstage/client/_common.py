"""What the async and sync clients share: request building, results, errors and the retry rule.

The retry rule (docs/protocol.md §7, livekit's convention): only UNAVAILABLE and RESOURCE_EXHAUSTED are
retried (RESOURCE_EXHAUSTED only with the server's retry hint: without one it is a size limit, which a retry
cannot pass), and only before the first audio chunk has reached the caller; once audio was handed out, a retry
would repeat speech, so the error is raised instead. A server's ``google.rpc.RetryInfo`` hint overrides the
exponential back-off.
"""

from __future__ import annotations

import io
import random
import wave
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import grpc
import numpy as np
from google.rpc import error_details_pb2, status_pb2

from voxstage import formats
from voxstage.v1 import speech_pb2

# The format table every face shares (voxstage.formats); the Literal spells it for type checkers, and a test
# keeps the two equal.
Encoding = Literal["pcm", "pcm_f32", "wav", "mulaw", "alaw", "mp3", "opus", "flac"]
ENCODINGS: dict[str, speech_pb2.AudioEncoding] = {
    f.name: speech_pb2.AudioEncoding.ValueType(f.encoding) for f in formats.FORMATS
}
NAMES: dict[int, str] = {v: k for k, v in ENCODINGS.items()}
RETRYABLE = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED})
DETAILS_KEY = "grpc-status-details-bin"


class SpeechError(Exception):
    """A failed call: the gRPC code, the server's message and, when given, its retry hint in seconds."""

    def __init__(self, code: grpc.StatusCode, message: str, retry_after_s: float | None = None) -> None:
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self.message = message
        self.retry_after_s = retry_after_s

    @property
    def retryable(self) -> bool:
        # RESOURCE_EXHAUSTED is a refusal to retry only when the server said when (its RetryInfo: admission,
        # per-key limits). Without one it is the transport's (a message or its metadata over a size limit),
        # and the same call would fail the same way: issue 26 saw a too-long voice name retried three times.
        if self.code is grpc.StatusCode.RESOURCE_EXHAUSTED:
            return self.retry_after_s is not None
        return self.code in RETRYABLE


def error_from_rpc(exc: grpc.RpcError) -> SpeechError:
    code: grpc.StatusCode = exc.code()  # type: ignore[attr-defined]
    details: str = exc.details() or ""  # type: ignore[attr-defined]
    retry_after: float | None = None
    trailers: Iterable[tuple[str, Any]] = exc.trailing_metadata() or ()  # type: ignore[attr-defined]
    for key, value in trailers:
        if key != DETAILS_KEY:
            continue
        status = status_pb2.Status.FromString(value)
        for detail in status.details:
            info = error_details_pb2.RetryInfo()
            if detail.Unpack(info):
                retry_after = info.retry_delay.ToNanoseconds() / 1e9
    return SpeechError(code, details, retry_after)


@dataclass(frozen=True)
class RetryPolicy:
    """Attempts in all (1 = no retry) and the exponential back-off between them, with full jitter."""

    max_attempts: int = 3
    initial_backoff_s: float = 0.2
    max_backoff_s: float = 5.0

    def delay(self, attempt: int, err: SpeechError) -> float | None:
        """Seconds to wait before attempt ``attempt + 1``, or None when ``err`` must be raised."""
        if not err.retryable or attempt >= self.max_attempts:
            return None
        if err.retry_after_s is not None:
            return min(err.retry_after_s, self.max_backoff_s)
        return random.uniform(0, min(self.initial_backoff_s * 2 ** (attempt - 1), self.max_backoff_s))


@dataclass(frozen=True)
class StreamInfo:
    """The stream's effective format (the server's ``started`` message)."""

    request_id: str
    encoding: str
    sample_rate: int
    channels: int
    model: str
    voice: str


@dataclass(frozen=True)
class AudioChunk:
    data: bytes
    sample_offset: int
    segment_index: int


@dataclass
class Audio:
    """A whole clip. ``data`` is in ``encoding``; ``to_numpy`` decodes the PCM-like encodings."""

    data: bytes
    encoding: str
    sample_rate: int
    channels: int = 1
    request_id: str = ""
    time_to_first_audio_s: float = 0.0
    chunks: list[AudioChunk] = field(default_factory=list, repr=False)

    @property
    def duration_s(self) -> float:
        return len(self.to_numpy()) / self.sample_rate

    def to_numpy(self) -> np.ndarray:
        """Mono float32 samples (pcm, pcm_f32 and wav; other encodings need a decoder such as soundfile)."""
        if self.encoding == "pcm":
            return np.frombuffer(self.data, "<i2").astype(np.float32) / 32768.0
        if self.encoding == "pcm_f32":
            return np.frombuffer(self.data, "<f4").astype(np.float32)
        if self.encoding == "wav":
            with wave.open(io.BytesIO(_fix_streamed_wav(self.data))) as w:
                return np.frombuffer(w.readframes(w.getnframes()), "<i2").astype(np.float32) / 32768.0
        raise ValueError(f"to_numpy: {self.encoding} audio needs a decoder (e.g. soundfile.read)")

    def save(self, path: str | Path) -> None:
        """Write the clip; pcm/pcm_f32 are wrapped in a WAV header when the file name ends in .wav."""
        target = Path(path)
        if target.suffix.lower() == ".wav" and self.encoding in ("pcm", "pcm_f32"):
            pcm16 = (np.clip(self.to_numpy(), -1, 1) * 32767).round().astype("<i2")
            with wave.open(str(target), "wb") as w:
                w.setnchannels(1)
                w.setsampwidth(2)
                w.setframerate(self.sample_rate)
                w.writeframes(pcm16.tobytes())
            return
        data = _fix_streamed_wav(self.data) if self.encoding == "wav" else self.data
        target.write_bytes(data)


def _fix_streamed_wav(data: bytes) -> bytes:
    """A streamed WAV declares unknown sizes (0xFFFFFFFF); write the real ones so every reader accepts it."""
    if len(data) < 44 or data[:4] != b"RIFF" or data[4:8] != b"\xff\xff\xff\xff":
        return data
    size = len(data) - 44
    return b"RIFF" + (36 + size).to_bytes(4, "little") + data[8:40] + size.to_bytes(4, "little") + data[44:]


@dataclass(frozen=True)
class Voice:
    name: str
    model: str
    languages: tuple[str, ...]
    description: str
    native_sample_rate: int
    # Voice library entries (uploaded); built-in voices leave these at their defaults.
    uploaded: bool = False
    id: str = ""
    family: str = ""
    ref_text: str = ""
    sample_seconds: float = 0.0
    created_unix: float = 0.0
    consent: bool = False


def voice_from(v: speech_pb2.Voice) -> Voice:
    return Voice(
        v.name, v.model, tuple(v.languages), v.description, v.native_sample_rate_hz, v.uploaded, v.id,
        v.family, v.ref_text, v.sample_duration.seconds + v.sample_duration.nanos / 1e9,
        v.created.seconds + v.created.nanos / 1e9, v.consent,
    )  # fmt: skip


def create_voice_request(
    name: str,
    audio: bytes | str | Path,
    *,
    ref_text: str = "",
    model: str = "",
    language: str = "",
    description: str = "",
    consent_audio: bytes | str | Path | None = None,
) -> speech_pb2.CreateVoiceRequest:
    """``audio`` and ``consent_audio`` are an audio file's bytes or its path."""

    def read(x: bytes | str | Path) -> bytes:
        return x if isinstance(x, bytes) else Path(x).read_bytes()

    return speech_pb2.CreateVoiceRequest(
        name=name, audio=read(audio), ref_text=ref_text, model=model, language=language,
        description=description, consent_audio=read(consent_audio) if consent_audio is not None else b"",
    )  # fmt: skip


def build_config(
    *,
    encoding: str,
    voice: str = "",
    model: str = "",
    language: str = "",
    instructions: str = "",
    sample_rate: int | None = None,
    seed: int | None = None,
    temperature: float | None = None,
    top_k: int | None = None,
    top_p: float | None = None,
    repetition_penalty: float | None = None,
    max_frames: int | None = None,
    reference_audio: bytes | None = None,
    reference_text: str = "",
    reference_encoding: str = "wav",
    reference_sample_rate: int = 0,
) -> speech_pb2.SynthesisConfig:
    if encoding not in ENCODINGS:
        raise ValueError(f"encoding: {encoding!r} is not one of {', '.join(ENCODINGS)}")
    config = speech_pb2.SynthesisConfig(
        model=model,
        voice=voice,
        language=language,
        instructions=instructions,
        encoding=ENCODINGS[encoding],
        sample_rate_hz=sample_rate or 0,
    )
    if seed is not None:
        config.seed = seed
    for name, value in (
        ("temperature", temperature),
        ("top_k", top_k),
        ("top_p", top_p),
        ("repetition_penalty", repetition_penalty),
        ("max_frames", max_frames),
    ):
        if value is not None:
            setattr(config.sampling, name, value)
    if reference_audio is not None:
        if reference_encoding not in ("pcm", "pcm_f32", "wav"):
            raise ValueError(f"reference_encoding: {reference_encoding!r} is not one of pcm, pcm_f32, wav")
        config.reference_audio.CopyFrom(
            speech_pb2.ReferenceAudio(
                data=reference_audio,
                encoding=ENCODINGS[reference_encoding],
                sample_rate_hz=reference_sample_rate,
                text=reference_text,
            )
        )
    return config


def stream_info(started: speech_pb2.StreamStarted) -> StreamInfo:
    return StreamInfo(
        request_id=started.request_id,
        encoding=NAMES.get(started.encoding, str(started.encoding)),
        sample_rate=started.sample_rate_hz,
        channels=started.channels,
        model=started.model,
        voice=started.voice,
    )


def voices_from(reply: speech_pb2.ListVoicesResponse) -> list[Voice]:
    return [voice_from(v) for v in reply.voices]


def audio_from(reply: speech_pb2.SynthesizeResponse) -> Audio:
    return Audio(
        data=reply.audio,
        encoding=NAMES.get(reply.encoding, str(reply.encoding)),
        sample_rate=reply.sample_rate_hz,
        channels=reply.channels,
        request_id=reply.summary.request_id,
        time_to_first_audio_s=reply.summary.time_to_first_audio.ToNanoseconds() / 1e9,
    )


def open_channel(
    address: str,
    options: Any,
    *,
    tls: bool,
    root_certificates: bytes | str | Path | None,
    aio: bool,
) -> Any:
    """A channel to the gateway: plain text by default; TLS with ``tls=True`` (the system's roots) or
    ``root_certificates`` (PEM bytes, or a path to a PEM file, e.g. a self-signed gateway certificate)."""
    module: Any = grpc.aio if aio else grpc
    if not tls and root_certificates is None:
        return module.insecure_channel(address, options=options)
    if isinstance(root_certificates, (str, Path)):
        root_certificates = Path(root_certificates).expanduser().read_bytes()
    credentials = grpc.ssl_channel_credentials(root_certificates=root_certificates)
    return module.secure_channel(address, credentials, options=options)


class KeyedStub:
    """A ``SpeechStub`` whose every call carries ``authorization: Bearer <api_key>`` metadata.

    Wrapping the stub, not the channel, keeps the calls grpc's own objects (a client interceptor would
    change the call type that the sessions and their retry rule depend on)."""

    def __init__(self, stub: Any, api_key: str) -> None:
        self._stub = stub
        self._metadata = (("authorization", f"Bearer {api_key}"),)

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._stub, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            kwargs["metadata"] = (*(kwargs.get("metadata") or ()), *self._metadata)
            return method(*args, **kwargs)

        return call


def make_stub(stub: Any, api_key: str | None) -> Any:
    if api_key is None:
        return stub
    if not api_key or any(c.isspace() for c in api_key):
        raise ValueError("api_key must be a non-empty key without whitespace")
    return KeyedStub(stub, api_key)


API_KEY_ENV = "VOXSTAGE_API_KEY"


def add_connection_options(parser: Any) -> None:
    """``--api-key``, ``--tls`` and ``--root-certificates`` for the ``say`` and ``talk`` commands."""
    parser.add_argument(
        "--api-key", default=None, metavar="KEY",
        help=f"API key for a gateway that requires one (default: ${API_KEY_ENV})",
    )  # fmt: skip
    parser.add_argument("--tls", action="store_true", help="connect over TLS, trusting the system's roots")
    parser.add_argument(
        "--root-certificates", default=None, metavar="PEM", help="connect over TLS, trusting this CA file"
    )


def connection_options(args: Any) -> dict[str, Any]:
    import os

    return {
        "api_key": args.api_key or os.environ.get(API_KEY_ENV) or None,
        "tls": args.tls,
        "root_certificates": args.root_certificates,
    }
