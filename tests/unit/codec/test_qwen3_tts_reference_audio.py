"""Reference-clip input handling (validation, mono mix, resampling) and the speaker encoder's log-mel."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from services.codec.models.qwen3_tts.encoder import random_init_encoder, tiny_encoder_config
from services.codec.models.qwen3_tts.mel import (
    SPEAKER_MEL,
    hz_to_mel,
    mel_spectrogram,
    mel_to_hz,
    slaney_mel_filterbank,
)
from services.codec.models.qwen3_tts.reference_audio import ReferenceAudioError, prepare_reference_audio
from services.codec.models.qwen3_tts.speaker_encoder import (
    random_init_speaker_encoder,
    tiny_speaker_encoder_config,
)

SR = 24_000


def _tone(seconds: float, sr: int = SR, seed: int = 0) -> np.ndarray:
    n = int(round(seconds * sr))
    t = np.arange(n) / sr
    rng = np.random.default_rng(seed)
    wave = 0.3 * np.sin(2 * np.pi * 190 * t) + 0.2 * np.sin(2 * np.pi * 1300 * t)
    wave += 0.05 * rng.standard_normal(n)
    return wave.astype(np.float32)


@pytest.fixture(scope="module")
def tiny_encoder() -> torch.nn.Module:
    return random_init_encoder(tiny_encoder_config(), seed=0)


@pytest.fixture(scope="module")
def tiny_speaker() -> torch.nn.Module:
    return random_init_speaker_encoder(tiny_speaker_encoder_config(32), seed=0)


# ---------------------------------------------------------------------------------------------- mel


def test_slaney_scale_anchors() -> None:
    # Slaney's scale is linear (200/3 Hz per mel) to 1 kHz = 15 mel, then log with 27 mel per factor 6.4.
    assert hz_to_mel(np.array(1000.0)) == pytest.approx(15.0)
    assert hz_to_mel(np.array(200.0)) == pytest.approx(3.0)
    assert hz_to_mel(np.array(6400.0)) == pytest.approx(15.0 + 27.0)
    hz = np.array([0.0, 123.0, 999.0, 1000.0, 4321.0, 12000.0])
    np.testing.assert_allclose(mel_to_hz(hz_to_mel(hz)), hz, rtol=1e-12, atol=1e-9)


def test_slaney_filterbank_shape_and_area_norm() -> None:
    fb = slaney_mel_filterbank(SR, 1024, 128, 0.0, 12_000.0)
    assert fb.shape == (128, 513) and fb.dtype == np.float32
    assert (fb >= 0).all() and (fb.sum(axis=1) > 0).all()
    assert fb[:, 513 - 1].max() == 0.0  # nothing at Nyquist when fmax = sr/2 is the last edge
    # Slaney norm gives every triangle unit area in Hz; wide filters are resolved well enough to see it.
    bin_hz = SR / 1024
    areas = fb.sum(axis=1) * bin_hz
    wide = (fb > 0).sum(axis=1) >= 12
    np.testing.assert_allclose(areas[wide], 1.0, rtol=0.02)
    with pytest.raises(ValueError, match="fmin < fmax"):
        slaney_mel_filterbank(SR, 1024, 128, 0.0, 20_000.0)


def test_mel_frames_and_minimum_length() -> None:
    for n in (SPEAKER_MEL.min_samples, 1000, 24_000, 24_000 + 255):
        mel = mel_spectrogram(torch.from_numpy(_tone(n / SR))[None])
        assert mel.shape == (1, 128, SPEAKER_MEL.num_frames(n))
        assert mel.shape[2] == max(1, n // 256)
    with pytest.raises(ValueError, match="at least"):
        mel_spectrogram(torch.zeros(1, SPEAKER_MEL.min_samples - 1))
    silent = mel_spectrogram(torch.zeros(1, 4096))
    assert torch.allclose(silent, torch.full_like(silent, math.log(1e-5)))  # the log floor


# -------------------------------------------------------------------------------------------- input handling


@pytest.mark.parametrize(
    ("audio", "rate", "match"),
    [
        (np.zeros(0, np.float32), SR, "empty"),
        (np.zeros((0, 2), np.float32), SR, "empty"),
        (np.zeros(SR * 3, np.float32), SR, "limit is 2 s"),
        (np.array([0.0, np.nan, 0.1], np.float32), SR, "NaN or infinite"),
        (np.array([0.0, np.inf], np.float32), SR, "NaN or infinite"),
        (np.zeros((2, 3, 4), np.float32), SR, "shape"),
        (np.array(0.5, np.float32), SR, "shape"),
        (np.zeros((2, 4800), np.float32), SR, "transpose"),
        (np.zeros(100, np.int16), SR, "float PCM"),
        (torch.zeros(100, dtype=torch.int32), SR, "float PCM"),
        ([0.0, 0.1], SR, "numpy array or torch tensor"),
        (np.zeros(100, np.float32), 0, "sample_rate"),
        (np.zeros(100, np.float32), 24000.0, "sample_rate"),
        (np.zeros(100, np.float32), True, "sample_rate"),
    ],
)
def test_bad_reference_audio_is_rejected(audio: object, rate: object, match: str) -> None:
    with pytest.raises(ReferenceAudioError, match=match):
        prepare_reference_audio(audio, rate, max_seconds=2.0)  # type: ignore[arg-type]


def test_bad_input_errors_reach_both_paths(
    tiny_encoder: torch.nn.Module, tiny_speaker: torch.nn.Module
) -> None:
    for call in (tiny_encoder.encode_reference, tiny_speaker.embed_reference):
        with pytest.raises(ReferenceAudioError, match="limit is 1 s"):
            call(_tone(1.5), SR, max_seconds=1.0)
        with pytest.raises(ReferenceAudioError, match="empty"):
            call(np.zeros(0, np.float32), SR)


def test_mono_mix_and_resampling(tiny_encoder: torch.nn.Module) -> None:
    mono = _tone(1.0)
    stereo = np.stack([mono, mono], axis=1)
    torch.testing.assert_close(prepare_reference_audio(stereo, SR), torch.from_numpy(mono))
    torch.testing.assert_close(
        prepare_reference_audio(torch.from_numpy(stereo).to(torch.float64), SR), torch.from_numpy(mono)
    )
    # Stereo mixing is the channel mean, as the reference does.
    mixed = prepare_reference_audio(np.stack([mono, np.zeros_like(mono)], axis=1), SR)
    torch.testing.assert_close(mixed, torch.from_numpy(mono) / 2)

    t48 = np.arange(48_000) / 48_000
    resampled = prepare_reference_audio(np.sin(2 * np.pi * 440 * t48).astype(np.float32), 48_000)
    assert resampled.shape == (24_000,)
    t24 = np.arange(24_000) / SR
    expected = np.sin(2 * np.pi * 440 * t24)
    # Away from the edges the polyphase resampler reproduces the tone closely.
    np.testing.assert_allclose(resampled.numpy()[200:-200], expected[200:-200], atol=2e-3)
    codes = tiny_encoder.encode_reference(np.sin(2 * np.pi * 440 * t48).astype(np.float32), 48_000)
    assert codes.shape == (16, 13)
