"""Audio of full-duplex sessions at the public edge: the formats, the limits, and the conversions.

This module is the one place that says which audio a duplex session takes and gives, and how much: the
WebSocket face (``/v1/realtime``), the gRPC face (``Converse``), the SDK and docs/api.md all read these
tables (a test holds the docs to them). The model side is fixed: mono float32 at 24 kHz, cut into 80 ms
frames of 1920 samples, one ``user_audio`` message per frame (docs/protocol.md §4, §11).

* Input: any chunk size in the session's input format is decoded (G.711 through lookup tables),
  resampled to 24 kHz and merged into whole frames (``Framer``).
* Output: agent PCM (24 kHz float32) is converted to the session's output format (``OutputEncoder``).

The G.711 formats are 8 kHz, exactly a third of 24 kHz, and resampled by ``ThirdRateFilter``: a 145-tap
linear-phase FIR (Kaiser-windowed sinc) run as a streaming polyphase filter, flat to 3.3 kHz (-0.1 dB) and
at least 71 dB down from 4 kHz, 3 ms of delay, and exactly one output sample per three input samples (or
three per one) on every call. libsoxr's streaming resampler (``voxstage.audio``, used for text-to-speech)
works in internal blocks: measured on 80 ms frames it held back 43 ms on average and up to 73 ms in each
direction (HQ; 22/40 ms at LQ), latency a conversation cannot spare.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from voxstage import g711
from voxstage.audio import float_to_s16
from voxstage.base64_text import decode_base64_text
from voxstage.duplex import FRAME_SAMPLES, FRAME_SECONDS, SAMPLE_RATE, regrant_at
from voxstage.v1 import speech_pb2

# The session frame (voxstage.duplex): what the codec takes and gives; one frame per user_audio message.
MODEL_RATE = SAMPLE_RATE
# User audio the gateway holds beyond the codec's grant (§11); older frames are dropped past it, so the
# input never lags real time by more than this.
INPUT_BUFFER_SECONDS = 2.0
INPUT_BUFFER_FRAMES = round(INPUT_BUFFER_SECONDS / FRAME_SECONDS)
# Agent audio the codec may send ahead of delivery (the gateway's initial grant, §11's recommended 2 s).
AGENT_WINDOW_SAMPLES = 2 * MODEL_RATE
# What the gateway gives back at a time as agent audio reaches the client (voxstage.duplex.regrant_at).
AGENT_GRANT_SAMPLES = regrant_at(AGENT_WINDOW_SAMPLES)
# Decoded audio bytes one input_audio_buffer.append may carry (10.9 s of pcm, 65 s of G.711): a client
# streams in real time, and anything longer than the buffer only turns into dropped audio.
MAX_APPEND_BYTES = 512 * 1024
# One WebSocket client event (a JSON text frame), checked before it is parsed; base64 of the largest
# append fits with room for its envelope.
MAX_EVENT_BYTES = 1024 * 1024


class DuplexAudioError(ValueError):
    """Client audio that cannot be used; the message says why (the face adds the field)."""


@dataclass(frozen=True)
class DuplexFormat:
    name: str  # the SDK's and CLI's name
    realtime_type: str  # OpenAI Realtime GA `audio.*.format.type`
    encoding: int  # voxstage.v1 AudioEncoding of RealtimeAudioFormat
    sample_rate: int
    bytes_per_sample: int
    description: str


PCM = DuplexFormat(
    "pcm", "audio/pcm", speech_pb2.AUDIO_ENCODING_PCM_S16LE, 24_000, 2, "16-bit signed little-endian PCM"
)
PCMU = DuplexFormat("pcmu", "audio/pcmu", speech_pb2.AUDIO_ENCODING_MULAW, 8_000, 1, "G.711 mu-law")
PCMA = DuplexFormat("pcma", "audio/pcma", speech_pb2.AUDIO_ENCODING_ALAW, 8_000, 1, "G.711 A-law")
FORMATS: tuple[DuplexFormat, ...] = (PCM, PCMU, PCMA)
DEFAULT_FORMAT = PCM


def format_named(name: str) -> DuplexFormat | None:
    return next((f for f in FORMATS if f.name == name), None)


def format_of_type(realtime_type: str) -> DuplexFormat | None:
    return next((f for f in FORMATS if f.realtime_type == realtime_type), None)


def format_of_encoding(encoding: int) -> DuplexFormat | None:
    return next((f for f in FORMATS if f.encoding == encoding), None)


def allowed_types() -> str:
    return ", ".join(f"{f.realtime_type} ({f.sample_rate} Hz)" for f in FORMATS)


def check_format(fmt: DuplexFormat, rate: int | None) -> DuplexFormat:
    """``rate`` as stated by the client (None or 0: unstated) must be the format's one rate."""
    if rate and rate != fmt.sample_rate:
        raise DuplexAudioError(
            f"{fmt.realtime_type} is {fmt.sample_rate} Hz only, got {rate}; resample on the client"
        )
    return fmt


def decode_base64(text: str) -> bytes:
    try:
        return decode_base64_text(text)
    except ValueError:
        raise DuplexAudioError("not valid base64") from None


def _third_rate_taps(taps: int = 145, cutoff_hz: float = 3600.0, beta: float = 7.0) -> np.ndarray:
    n = np.arange(taps) - (taps - 1) / 2
    h = 2 * cutoff_hz / MODEL_RATE * np.sinc(2 * cutoff_hz / MODEL_RATE * n) * np.kaiser(taps, beta)
    return (h / h.sum()).astype(np.float32)


THIRD_RATE_TAPS = _third_rate_taps()
THIRD_RATE_DELAY_S = (THIRD_RATE_TAPS.size - 1) / 2 / MODEL_RATE


class ThirdRateFilter:
    """Streaming 24 kHz <-> 8 kHz (``up=True``: 8 -> 24). Chunks of any size; the concatenated output
    equals filtering the whole signal at once."""

    def __init__(self, *, up: bool) -> None:
        self.up = up
        self._history = np.zeros(THIRD_RATE_TAPS.size - 1, np.float32)
        self._phase = 0  # down: index, within the next input chunk, of its first sample to keep

    def process(self, pcm: np.ndarray) -> np.ndarray:
        x = pcm.astype(np.float32, copy=False)
        if self.up:
            stuffed = np.zeros(x.size * 3, np.float32)
            stuffed[::3] = 3.0 * x  # zero-stuffing divides the level by 3; the filter's gain is 1
            x = stuffed
        if x.size == 0:
            return x
        data = np.concatenate([self._history, x])
        self._history = data[-self._history.size :]
        y = np.convolve(data, THIRD_RATE_TAPS, mode="valid")  # one output per input sample
        if self.up:
            return y.astype(np.float32, copy=False)
        kept = y[self._phase :: 3]
        self._phase = (self._phase - x.size) % 3
        return np.ascontiguousarray(kept, dtype=np.float32)


def _resampler(rate: int, *, up: bool) -> ThirdRateFilter | None:
    if rate == MODEL_RATE:
        return None
    if rate * 3 != MODEL_RATE:
        raise ValueError(f"duplex formats are 24 kHz or 8 kHz, not {rate} Hz")
    return ThirdRateFilter(up=up)


class InputDecoder:
    """Client bytes in one format -> float32 at 24 kHz. A rejected chunk leaves the state untouched."""

    def __init__(self, fmt: DuplexFormat) -> None:
        self.fmt = fmt
        self._resampler = _resampler(fmt.sample_rate, up=True)

    def check(self, data: bytes) -> None:
        if not data:
            raise DuplexAudioError("empty audio")
        if len(data) > MAX_APPEND_BYTES:
            raise DuplexAudioError(
                f"{len(data)} bytes exceeds the limit of {MAX_APPEND_BYTES} bytes per append; "
                "send audio as it is captured, in chunks of 20-100 ms"
            )
        if len(data) % self.fmt.bytes_per_sample:
            raise DuplexAudioError(
                f"{len(data)} bytes is not a whole number of {self.fmt.bytes_per_sample}-byte samples "
                f"({self.fmt.realtime_type})"
            )

    def decode(self, data: bytes) -> np.ndarray:
        self.check(data)
        if self.fmt is PCM:
            s16 = np.frombuffer(data, dtype="<i2")
        elif self.fmt is PCMU:
            s16 = g711.decode_mulaw(data)
        else:
            s16 = g711.decode_alaw(data)
        pcm = s16.astype(np.float32) / 32768.0
        return pcm if self._resampler is None else self._resampler.process(pcm)

    def samples_in(self, nbytes: int) -> int:
        """24 kHz samples that ``nbytes`` of input make (for accounting; ignores the resampler's delay)."""
        return nbytes // self.fmt.bytes_per_sample * MODEL_RATE // self.fmt.sample_rate


class Framer:
    """Merges 24 kHz audio of any chunk size into whole 80 ms frames."""

    def __init__(self) -> None:
        self._held = np.zeros(0, np.float32)

    @property
    def held_samples(self) -> int:
        return int(self._held.size)

    def push(self, pcm: np.ndarray) -> list[np.ndarray]:
        data = np.concatenate([self._held, pcm.astype(np.float32, copy=False)]) if self._held.size else pcm
        whole = data.size // FRAME_SAMPLES * FRAME_SAMPLES
        frames = [
            np.ascontiguousarray(data[i : i + FRAME_SAMPLES], dtype=np.float32)
            for i in range(0, whole, FRAME_SAMPLES)
        ]
        self._held = np.array(data[whole:], dtype=np.float32)
        return frames


class OutputEncoder:
    """Agent PCM (float32, 24 kHz) -> bytes in the session's output format."""

    def __init__(self, fmt: DuplexFormat) -> None:
        self.fmt = fmt
        self._resampler = _resampler(fmt.sample_rate, up=False)

    def encode(self, pcm: np.ndarray) -> bytes:
        s16 = float_to_s16(pcm if self._resampler is None else self._resampler.process(pcm))
        if self.fmt is PCM:
            return s16.tobytes()
        if self.fmt is PCMU:
            return g711.encode_mulaw(s16)
        return g711.encode_alaw(s16)
