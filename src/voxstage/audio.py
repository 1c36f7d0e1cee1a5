"""Audio encoding, decoding and resampling at the public edge.

Models produce mono float32 PCM in [-1, 1] at their native rate. Users ask for a container/encoding and
optionally another sample rate. Streaming formats (raw PCM, WAV with an open-ended header, G.711) are
encoded chunk by chunk; compressed formats (FLAC, MP3, Opus) go through libsndfile (``soundfile``) and are
produced whole, so they are only offered for non-streaming responses. Resampling uses libsoxr's streaming
resampler so a chunked stream resamples exactly like the whole clip would.
"""

from __future__ import annotations

import enum
import io
import struct

import numpy as np
import soundfile as sf
import soxr

from voxstage import g711


class AudioError(ValueError):
    """Input audio that cannot be used; the message names the problem."""


class AudioFormat(enum.StrEnum):
    PCM = "pcm"  # headerless signed 16-bit little-endian (OpenAI's `pcm`)
    PCM_F32 = "pcm_f32"  # headerless float32 little-endian
    WAV = "wav"
    MULAW = "mulaw"
    ALAW = "alaw"
    FLAC = "flac"
    MP3 = "mp3"
    OPUS = "opus"

    @property
    def streamable(self) -> bool:
        return self in _STREAMABLE

    @property
    def content_type(self) -> str:
        return _CONTENT_TYPES[self]


_STREAMABLE = {AudioFormat.PCM, AudioFormat.PCM_F32, AudioFormat.WAV, AudioFormat.MULAW, AudioFormat.ALAW}
_CONTENT_TYPES = {
    AudioFormat.PCM: "audio/pcm",
    AudioFormat.PCM_F32: "audio/pcm",
    AudioFormat.WAV: "audio/wav",
    AudioFormat.MULAW: "audio/basic",
    AudioFormat.ALAW: "audio/x-alaw-basic",
    AudioFormat.FLAC: "audio/flac",
    AudioFormat.MP3: "audio/mpeg",
    AudioFormat.OPUS: "audio/ogg",
}
# libsndfile's Opus encoder only accepts the rates Opus itself defines.
OPUS_RATES = (8000, 12000, 16000, 24000, 48000)


def parse_format(name: str, *, field: str = "response_format") -> AudioFormat:
    try:
        return AudioFormat(name.lower())
    except ValueError:
        allowed = ", ".join(f.value for f in AudioFormat)
        raise AudioError(f"{field}: unsupported audio format {name!r}; expected one of {allowed}") from None


def float_to_s16(x: np.ndarray) -> np.ndarray:
    return (np.clip(x, -1.0, 1.0) * 32767.0).round().astype("<i2")


def wav_header(sample_rate: int, num_samples: int | None, channels: int = 1, bits: int = 16) -> bytes:
    """RIFF/WAVE header; ``num_samples=None`` writes the 0xFFFFFFFF sizes streaming players accept."""
    block = channels * bits // 8
    if num_samples is None:
        data_len, riff_len = 0xFFFFFFFF, 0xFFFFFFFF
    else:
        data_len = num_samples * block
        riff_len = 36 + data_len
    return (
        b"RIFF"
        + struct.pack("<I", riff_len)
        + b"WAVEfmt "
        + struct.pack("<IHHIIHH", 16, 1, channels, sample_rate, sample_rate * block, block, bits)
        + b"data"
        + struct.pack("<I", data_len)
    )


def _mulaw(x: np.ndarray) -> bytes:
    return g711.encode_mulaw(float_to_s16(x))


def _alaw(x: np.ndarray) -> bytes:
    return g711.encode_alaw(float_to_s16(x))


class StreamingEncoder:
    """Turns float32 PCM chunks into the bytes of one streaming response."""

    def __init__(self, fmt: AudioFormat, sample_rate: int) -> None:
        if not fmt.streamable:
            raise AudioError(f"response_format {fmt.value!r} cannot be streamed; use pcm, wav, mulaw or alaw")
        self.fmt = fmt
        self.sample_rate = sample_rate
        self._started = False

    def encode(self, pcm: np.ndarray) -> bytes:
        prefix = b""
        if not self._started:
            self._started = True
            if self.fmt is AudioFormat.WAV:
                prefix = wav_header(self.sample_rate, None)
        if pcm.size == 0:
            return prefix
        if self.fmt in (AudioFormat.PCM, AudioFormat.WAV):
            return prefix + float_to_s16(pcm).tobytes()
        if self.fmt is AudioFormat.PCM_F32:
            return prefix + np.asarray(pcm, dtype="<f4").tobytes()
        if self.fmt is AudioFormat.MULAW:
            return prefix + _mulaw(pcm)
        return prefix + _alaw(pcm)


def encode_clip(pcm: np.ndarray, fmt: AudioFormat, sample_rate: int) -> bytes:
    """Encode a whole clip (any format)."""
    if fmt.streamable:
        if fmt is AudioFormat.WAV:
            return wav_header(sample_rate, int(pcm.size)) + float_to_s16(pcm).tobytes()
        return StreamingEncoder(fmt, sample_rate).encode(pcm)
    if fmt is AudioFormat.OPUS and sample_rate not in OPUS_RATES:
        raise AudioError(f"sample_rate: opus supports {OPUS_RATES}, not {sample_rate}")
    container, subtype = {
        AudioFormat.FLAC: ("FLAC", "PCM_16"),
        AudioFormat.MP3: ("MP3", "MPEG_LAYER_III"),
        AudioFormat.OPUS: ("OGG", "OPUS"),
    }[fmt]
    buf = io.BytesIO()
    sf.write(buf, np.clip(pcm, -1.0, 1.0).astype(np.float32), sample_rate, format=container, subtype=subtype)
    return buf.getvalue()


class StreamingResampler:
    """Chunk-by-chunk resampling whose concatenated output equals one whole-clip pass (libsoxr state)."""

    def __init__(self, in_rate: int, out_rate: int) -> None:
        self.passthrough = in_rate == out_rate
        self._stream = (
            None if self.passthrough else soxr.ResampleStream(in_rate, out_rate, 1, dtype="float32")
        )

    def process(self, pcm: np.ndarray, last: bool = False) -> np.ndarray:
        if self._stream is None:
            return pcm.astype(np.float32, copy=False)
        return self._stream.resample_chunk(pcm.astype(np.float32, copy=False), last=last)


def resample(pcm: np.ndarray, in_rate: int, out_rate: int) -> np.ndarray:
    if in_rate == out_rate:
        return pcm.astype(np.float32, copy=False)
    return soxr.resample(pcm.astype(np.float32, copy=False), in_rate, out_rate).astype(np.float32)


def validate_sample_rate(rate: int, *, field: str = "sample_rate", low: int = 8000, high: int = 48000) -> int:
    if not low <= rate <= high:
        raise AudioError(f"{field}: {rate} Hz is outside the supported range {low}..{high} Hz")
    return rate


def decode_audio(
    data: bytes,
    *,
    field: str = "ref_audio",
    max_bytes: int = 10 * 1024 * 1024,
    max_seconds: float = 60.0,
    raw_sample_rate: int | None = None,
) -> tuple[np.ndarray, int]:
    """Decode user-supplied audio (WAV/FLAC/OGG/MP3, or raw s16le when ``raw_sample_rate`` is given).

    Returns mono float32 and its sample rate. Every rejection names ``field``.
    """
    if not data:
        raise AudioError(f"{field}: empty audio")
    if len(data) > max_bytes:
        raise AudioError(f"{field}: {len(data)} bytes exceeds the limit of {max_bytes} bytes")
    if raw_sample_rate is not None:
        if len(data) % 2:
            raise AudioError(f"{field}: raw s16le audio must have an even number of bytes")
        pcm = np.frombuffer(data, dtype="<i2").astype(np.float32) / 32768.0
        rate = validate_sample_rate(raw_sample_rate, field=f"{field}.sample_rate")
    else:
        try:
            pcm2d, rate = sf.read(io.BytesIO(data), dtype="float32", always_2d=True)
        except (sf.LibsndfileError, RuntimeError, TypeError) as exc:
            raise AudioError(f"{field}: not a decodable audio file ({exc})") from None
        pcm = pcm2d.mean(axis=1) if pcm2d.shape[1] > 1 else pcm2d[:, 0]
        validate_sample_rate(int(rate), field=f"{field}.sample_rate")
    if pcm.size == 0:
        raise AudioError(f"{field}: audio holds no samples")
    if pcm.size / rate > max_seconds:
        raise AudioError(f"{field}: {pcm.size / rate:.1f} s exceeds the limit of {max_seconds:.0f} s")
    if not np.isfinite(pcm).all():
        raise AudioError(f"{field}: audio contains NaN or infinite samples")
    return np.ascontiguousarray(pcm, dtype=np.float32), int(rate)
