"""Audio edge: encodings agree with independent implementations; resampling streams like the whole clip."""

from __future__ import annotations

import io
import warnings

import numpy as np
import pytest
import soundfile as sf

from voxstage.audio import (
    AudioError,
    AudioFormat,
    StreamingEncoder,
    StreamingResampler,
    decode_audio,
    encode_clip,
    float_to_s16,
    parse_format,
    resample,
)

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    # The stdlib's G.711 codec is the independent reference (present up to Python 3.12).
    audioop = pytest.importorskip("audioop")


@pytest.fixture
def tone() -> np.ndarray:
    t = np.arange(24000) / 24000
    noise = np.random.default_rng(0).standard_normal(t.size)
    return (0.6 * np.sin(2 * np.pi * 220 * t) + 0.05 * noise).astype(np.float32)


@pytest.mark.parametrize(
    "fmt,ref", [(AudioFormat.MULAW, audioop.lin2ulaw), (AudioFormat.ALAW, audioop.lin2alaw)]
)
def test_g711_matches_stdlib(tone: np.ndarray, fmt: AudioFormat, ref) -> None:
    ours = StreamingEncoder(fmt, 8000).encode(tone)
    theirs = ref(float_to_s16(tone).tobytes(), 2)
    assert ours == theirs


def test_wav_stream_header_then_pcm(tone: np.ndarray) -> None:
    enc = StreamingEncoder(AudioFormat.WAV, 24000)
    data = enc.encode(tone[:1000]) + enc.encode(tone[1000:])
    assert data[:4] == b"RIFF" and len(data) == 44 + 2 * tone.size
    whole = encode_clip(tone, AudioFormat.WAV, 24000)
    pcm, rate = sf.read(io.BytesIO(whole), dtype="int16")
    assert rate == 24000 and np.array_equal(pcm, float_to_s16(tone))


@pytest.mark.parametrize("fmt", [AudioFormat.FLAC, AudioFormat.MP3, AudioFormat.OPUS])
def test_compressed_formats_decode_back(tone: np.ndarray, fmt: AudioFormat) -> None:
    data = encode_clip(tone, fmt, 24000)
    pcm, rate = decode_audio(data)
    assert rate in (24000, 48000)
    assert abs(pcm.size / rate - 1.0) < 0.1


def test_streaming_resampler_equals_whole(tone: np.ndarray) -> None:
    rs = StreamingResampler(24000, 16000)
    parts = [rs.process(tone[i : i + 1920]) for i in range(0, tone.size, 1920)]
    parts.append(rs.process(np.zeros(0, np.float32), last=True))
    streamed = np.concatenate(parts)
    whole = resample(tone, 24000, 16000)
    assert abs(streamed.size - whole.size) <= 1
    n = min(streamed.size, whole.size)
    assert np.max(np.abs(streamed[:n] - whole[:n])) < 1e-4


def test_bad_inputs_name_the_field() -> None:
    with pytest.raises(AudioError, match="response_format"):
        parse_format("aiff")
    with pytest.raises(AudioError, match="ref_audio: empty"):
        decode_audio(b"")
    with pytest.raises(AudioError, match="ref_audio: not a decodable"):
        decode_audio(b"not audio at all" * 10)
    with pytest.raises(AudioError, match="exceeds the limit"):
        decode_audio(b"\0" * 100, max_bytes=10)
    with pytest.raises(AudioError, match="cannot be streamed"):
        StreamingEncoder(AudioFormat.FLAC, 24000)
    with pytest.raises(AudioError, match="opus supports"):
        encode_clip(np.zeros(100, np.float32), AudioFormat.OPUS, 22050)
