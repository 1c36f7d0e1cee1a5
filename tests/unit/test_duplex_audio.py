"""Duplex audio at the edge: G.711 tables, the 8 <-> 24 kHz filter, framing, and the decoders' refusals."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import soxr

from voxstage import g711
from voxstage.duplex_audio import (
    FORMATS,
    FRAME_SAMPLES,
    MAX_APPEND_BYTES,
    PCM,
    PCMA,
    PCMU,
    THIRD_RATE_DELAY_S,
    DuplexAudioError,
    Framer,
    InputDecoder,
    OutputEncoder,
    ThirdRateFilter,
    check_format,
    decode_base64,
    format_of_encoding,
    format_of_type,
)

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    audioop = pytest.importorskip("audioop")  # the stdlib's G.711 is the independent reference (to 3.12)

ALL_S16 = np.arange(-32768, 32768, dtype=np.int16)
ALL_CODES = bytes(range(256))


def test_g711_tables_match_the_stdlib_on_every_value() -> None:
    assert g711.encode_mulaw(ALL_S16) == audioop.lin2ulaw(ALL_S16.tobytes(), 2)
    assert g711.encode_alaw(ALL_S16) == audioop.lin2alaw(ALL_S16.tobytes(), 2)
    assert g711.decode_mulaw(ALL_CODES).tobytes() == audioop.ulaw2lin(ALL_CODES, 2)
    assert g711.decode_alaw(ALL_CODES).tobytes() == audioop.alaw2lin(ALL_CODES, 2)


def band_limited_noise(seconds: float, rate: int, top_hz: float) -> np.ndarray:
    x = np.random.default_rng(1).standard_normal(int(seconds * rate))
    spectrum = np.fft.rfft(x)
    spectrum[np.fft.rfftfreq(x.size, 1 / rate) > top_hz] = 0
    return (0.2 * np.fft.irfft(spectrum, x.size) / np.abs(np.fft.irfft(spectrum, x.size)).max()).astype(
        np.float32
    )


@pytest.mark.parametrize("up", [False, True])
def test_third_rate_filter_streams_exactly_and_matches_soxr(up: bool) -> None:
    rate_in, rate_out = (8000, 24000) if up else (24000, 8000)
    x = band_limited_noise(2.0, rate_in, 3000.0)
    f = ThirdRateFilter(up=up)
    sizes = np.random.default_rng(2).integers(1, 2000, 200)
    out, i = [], 0
    for n in sizes:
        piece = f.process(x[i : i + n])
        out.append(piece)
        i += n
        if i >= x.size:
            break
    y = np.concatenate(out)
    assert y.size == x.size * rate_out // rate_in  # no samples held back: the delay is in the content
    whole = ThirdRateFilter(up=up).process(x)
    assert np.allclose(y, whole, atol=1e-6)
    delay = round(THIRD_RATE_DELAY_S * rate_out)
    ref = soxr.resample(x, rate_in, rate_out)
    compared = y[delay:][: ref.size - delay]
    assert np.abs(compared[200:-200] - ref[: compared.size][200:-200]).max() < 1e-3  # the passband is flat


def test_third_rate_filter_rejects_what_8_khz_cannot_hold() -> None:
    t = np.arange(24000) / 24000
    out = ThirdRateFilter(up=False).process((0.5 * np.sin(2 * np.pi * 6000 * t)).astype(np.float32))
    assert np.abs(out[100:]).max() < 0.5 * 10 ** (-60 / 20)  # a 6 kHz tone would alias to 2 kHz


def test_framer_merges_any_chunk_sizes_into_80_ms_frames() -> None:
    x = np.arange(10 * FRAME_SAMPLES + 77, dtype=np.float32)
    framer, frames, i = Framer(), [], 0
    for n in (1, 479, 1920, 3000, 5, 7000, 10000):
        frames += framer.push(x[i : i + n])
        i += n
    assert len(frames) == 10 and all(f.size == FRAME_SAMPLES for f in frames)
    assert np.array_equal(np.concatenate(frames), x[: 10 * FRAME_SAMPLES]) and framer.held_samples == 77


@pytest.mark.parametrize("fmt", FORMATS)
def test_round_trip_sizes_and_level(fmt) -> None:  # type: ignore[no-untyped-def]
    t = np.arange(fmt.sample_rate) / fmt.sample_rate
    s16 = (0.4 * np.sin(2 * np.pi * 440 * t) * 32767).astype("<i2")
    data = {PCM: s16.tobytes(), PCMU: g711.encode_mulaw(s16), PCMA: g711.encode_alaw(s16)}[fmt]
    pcm = InputDecoder(fmt).decode(data)
    assert pcm.size == 24_000 and 0.38 < np.abs(pcm[500:]).max() < 0.42
    encoder = OutputEncoder(fmt)
    frames = [encoder.encode(pcm[i : i + FRAME_SAMPLES]) for i in range(0, 12 * FRAME_SAMPLES, FRAME_SAMPLES)]
    assert {len(f) for f in frames} == {FRAME_SAMPLES * fmt.bytes_per_sample * fmt.sample_rate // 24_000}


def test_decoder_refusals_leave_its_state_alone() -> None:
    decoder = InputDecoder(PCM)
    with pytest.raises(DuplexAudioError, match="whole number of 2-byte samples"):
        decoder.decode(b"\x00\x01\x02")
    with pytest.raises(DuplexAudioError, match="empty"):
        decoder.decode(b"")
    with pytest.raises(DuplexAudioError, match="per append"):
        decoder.decode(b"\x00" * (MAX_APPEND_BYTES + 2))
    assert InputDecoder(PCMU).decode(b"\xff").size == 3  # one G.711 byte is one sample
    with pytest.raises(DuplexAudioError, match="base64"):
        decode_base64("a=b")
    assert decode_base64("AAE=") == b"\x00\x01"


def test_format_tables() -> None:
    assert format_of_type("audio/pcmu") is PCMU and format_of_type("audio/opus") is None
    assert format_of_encoding(PCMA.encoding) is PCMA
    assert check_format(PCM, 24_000) is PCM and check_format(PCMU, 0) is PCMU
    with pytest.raises(DuplexAudioError, match="8000 Hz only"):
        check_format(PCMA, 16_000)
