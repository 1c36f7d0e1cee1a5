"""Audio encoding, decoding and resampling at the public edge.

Models produce mono float32 PCM in [-1, 1] at their native rate. Users ask for a container/encoding and
optionally another sample rate; which formats exist, which stream and at which rates is ``voxstage.formats``'
table. Raw PCM, WAV (an open-ended header when streamed) and G.711 are encoded here, chunk by chunk; the
compressed formats (MP3, Ogg/Opus, FLAC) by libsndfile (``sndfile_stream``), MP3 and Opus chunk by chunk
too. Resampling uses libsoxr's streaming resampler so a chunked stream resamples exactly like the whole clip
would.
"""

from __future__ import annotations

import enum
import io
import math
import re
import struct

import numpy as np
import soundfile as sf
import soxr

from voxstage import formats, g711, limits
from voxstage.base64_text import decode_base64_text
from voxstage.quote import quoted
from voxstage.sndfile_stream import SndfileEncoder


class AudioError(ValueError):
    """Input audio that cannot be used; the message names the problem."""


class AudioFormat(enum.StrEnum):
    """A name of ``voxstage.formats.FORMATS``, as an enum; what each can do is read from that table."""

    PCM = "pcm"
    PCM_F32 = "pcm_f32"
    WAV = "wav"
    MULAW = "mulaw"
    ALAW = "alaw"
    FLAC = "flac"
    MP3 = "mp3"
    OPUS = "opus"

    @property
    def spec(self) -> formats.OutputFormat:
        return formats.BY_NAME[self.value]

    @property
    def streamable(self) -> bool:
        return self.spec.streams

    @property
    def content_type(self) -> str:
        return self.spec.content_type


# The enum is a spelling of the table, never a second list: a format added to one must be added to both.
assert {f.value for f in AudioFormat} == set(formats.NAMES), "AudioFormat and voxstage.formats disagree"
_LIBSNDFILE = (AudioFormat.MP3, AudioFormat.OPUS, AudioFormat.FLAC)


def parse_format(name: str, *, field: str = "response_format") -> AudioFormat:
    try:
        return AudioFormat(name.lower())
    except ValueError:
        allowed = ", ".join(formats.NAMES)
        why = f"{field}: unsupported audio format {quoted(name)}; expected one of {allowed}"
        raise AudioError(why) from None


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
    """Turns float32 PCM chunks into the bytes of one streaming response; ``close()`` gives the bytes an
    encoder still held (MP3's and Opus's last frames), to send after the last chunk."""

    def __init__(self, fmt: AudioFormat, sample_rate: int) -> None:
        if not fmt.streamable:
            raise AudioError(
                f"response_format {fmt.value!r} cannot be streamed; use {', '.join(formats.STREAMING_NAMES)}"
            )
        if (why := formats.rate_problem(fmt.spec, sample_rate)) is not None:
            raise AudioError(f"sample_rate: {why}")
        self.fmt = fmt
        self.sample_rate = sample_rate
        self._started = False
        self._compressed = SndfileEncoder(fmt.value, sample_rate) if fmt in _LIBSNDFILE else None

    def encode(self, pcm: np.ndarray) -> bytes:
        if self._compressed is not None:
            return self._compressed.encode(pcm)
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

    def close(self) -> bytes:
        return b"" if self._compressed is None else self._compressed.close()


def encode_clip(pcm: np.ndarray, fmt: AudioFormat, sample_rate: int) -> bytes:
    """Encode a whole clip (any format)."""
    if fmt is AudioFormat.WAV:
        return wav_header(sample_rate, int(pcm.size)) + float_to_s16(pcm).tobytes()
    if (why := formats.rate_problem(fmt.spec, sample_rate)) is not None:
        raise AudioError(f"sample_rate: {why}")
    if fmt in _LIBSNDFILE:
        encoder = SndfileEncoder(fmt.value, sample_rate)
        encoder.encode(pcm)
        return encoder.finish()  # the header patched at close: a whole clip states its length
    return StreamingEncoder(fmt, sample_rate).encode(pcm)


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


def validate_sample_rate(
    rate: int,
    *,
    field: str = "sample_rate",
    low: int = limits.REFERENCE_SAMPLE_RATE.low,
    high: int = limits.REFERENCE_SAMPLE_RATE.end - 1,
) -> int:
    if not low <= rate <= high:
        raise AudioError(f"{field}: {rate} Hz is outside the supported range {low}..{high} Hz")
    return rate


def audio_from_base64(text: str, *, field: str = "ref_audio") -> bytes:
    """Base64 audio, bare or as a ``data:audio/...;base64,`` URL (URLs are never fetched)."""
    text = text.strip()
    if text.startswith(("http://", "https://")):
        raise AudioError(f"{field}: URLs are not fetched; send base64 audio or a data: URL")
    if text.startswith("data:"):
        header, sep, text = text.partition(",")
        if not sep or not header.endswith(";base64"):
            raise AudioError(f"{field}: a data URL must be base64-encoded (data:audio/wav;base64,...)")
    try:
        return decode_base64_text(text)
    except ValueError:
        raise AudioError(f"{field}: not valid base64") from None


# libsndfile reports SF_COUNT_MAX frames when a header does not state the length (a FLAC STREAMINFO of 0).
_UNKNOWN_FRAMES = 1 << 62
_BLOCK_SECONDS = 4  # decode and downmix this much at a time: the stereo/multichannel block is transient


def decode_audio(
    data: bytes,
    *,
    field: str = "ref_audio",
    max_bytes: int = limits.REFERENCE_BYTES.end - 1,
    max_seconds: float = limits.REFERENCE_SECONDS.high,
    raw_sample_rate: int | None = None,
    raw_format: str = "s16",
) -> tuple[np.ndarray, int]:
    """Decode user-supplied audio (WAV/FLAC/OGG/MP3, or headerless ``raw_format`` s16le/f32le when
    ``raw_sample_rate`` is given) to mono float32; returns it and its sample rate.

    The length is judged before anything is decoded (from the byte count, or the container's header), and a
    container is decoded in blocks of at most ``max_seconds`` + one frame in all, downmixed as it goes: a
    0.7 MB FLAC can hold an hour of 48 kHz stereo, 2 GB decoded (issue 15). Every rejection names ``field``;
    no decoded samples are referenced by a raised error. Blocking: call it from a worker thread.
    """
    if not data:
        raise AudioError(f"{field}: empty audio")
    if len(data) > max_bytes:
        raise AudioError(f"{field}: {len(data)} bytes exceeds the limit of {max_bytes} bytes")
    if raw_sample_rate is not None:
        pcm, rate = _decode_raw(data, field, max_seconds, raw_sample_rate, raw_format)
    else:
        pcm, rate = _decode_container(data, field, max_seconds)
    if not np.isfinite(pcm).all():
        del pcm  # the error must not keep the samples alive through this frame
        raise AudioError(f"{field}: audio contains NaN or infinite samples")
    return pcm, rate


def _too_long(field: str, seconds: float, max_seconds: float) -> AudioError:
    return AudioError(f"{field}: {seconds:.1f} s exceeds the limit of {max_seconds:.0f} s")


def _decode_raw(data: bytes, field: str, max_seconds: float, rate: int, fmt: str) -> tuple[np.ndarray, int]:
    width, dtype = {"s16": (2, "<i2"), "f32": (4, "<f4")}[fmt]
    if len(data) % width:
        raise AudioError(f"{field}: raw {fmt}le audio must be a multiple of {width} bytes")
    validate_sample_rate(rate, field=f"{field}.sample_rate")
    frames = len(data) // width
    if frames / rate > max_seconds:  # judged from the size, before converting anything
        raise _too_long(field, frames / rate, max_seconds)
    pcm = np.frombuffer(data, dtype=dtype).astype(np.float32)
    if fmt == "s16":
        pcm /= 32768.0
    return pcm, rate


def _decode_problem(exc: Exception) -> str:
    """libsndfile's own words, without the "Error opening <_io.BytesIO object at 0x...>:" that soundfile puts
    before them (a server's memory address is nobody's business)."""
    text = getattr(exc, "error_string", None) or str(exc)
    return re.sub(r"<[^<>]* at 0x[0-9a-fA-F]+>:?\s*", "", str(text)).strip() or type(exc).__name__


def _decode_container(data: bytes, field: str, max_seconds: float) -> tuple[np.ndarray, int]:
    try:
        f = sf.SoundFile(io.BytesIO(data))
    except (sf.LibsndfileError, RuntimeError, TypeError) as exc:
        raise AudioError(f"{field}: not a decodable audio file ({_decode_problem(exc)})") from None
    with f:
        rate, channels, frames = int(f.samplerate), int(f.channels), int(f.frames)
        # Everything the header says is judged before a single sample is decoded.
        validate_sample_rate(rate, field=f"{field}.sample_rate")
        if (why := limits.REFERENCE_CHANNELS.problem(channels)) is not None:
            raise AudioError(f"{field}: channels {why}")
        cap = math.floor(max_seconds * rate)  # frames allowed
        if cap < frames < _UNKNOWN_FRAMES:
            raise _too_long(field, frames / rate, max_seconds)
        # libsndfile reads no further than the length it reports; when it reports none, decode at most one
        # frame past the cap, which is how an over-long clip is then recognised.
        mono = np.empty(frames if frames < _UNKNOWN_FRAMES else cap + 1, np.float32)
        got = 0
        failure = None
        try:
            for block in f.blocks(rate * _BLOCK_SECONDS, dtype="float32", always_2d=True, frames=mono.size):
                n = min(len(block), mono.size - got)
                mono[got : got + n] = block[:n, 0] if channels == 1 else block[:n].mean(axis=1)
                got += n
                if got == mono.size:
                    break
        except (sf.LibsndfileError, RuntimeError, TypeError) as exc:
            failure = f"{field}: not a decodable audio file ({_decode_problem(exc)})"
        block = None  # a raised error's traceback holds this frame: it must hold no samples
    if failure is None and got > cap:
        failure = f"{field}: more than {max_seconds:.0f} s of audio exceeds the limit of {max_seconds:.0f} s"
    if failure is not None:
        del mono  # no decoded samples reachable from the error
        raise AudioError(failure)
    if got == 0:
        raise AudioError(f"{field}: audio holds no samples")
    # A length the header did not state (or overstated) got a larger buffer: keep only what was decoded.
    return (mono if got == mono.size else mono[:got].copy()), rate
