"""The log-mel front end of the Qwen3-TTS speaker encoder.

Matches the reference ``mel_spectrogram`` (qwen-tts 0.1.1): reflect-pad by (n_fft - hop) / 2 on both sides,
an uncentred STFT with a periodic Hann window, magnitude with a 1e-9 floor inside the square root, a
librosa-compatible Slaney mel filterbank, and ``log(clamp(x, 1e-5))``. The filterbank is computed here
(librosa is not a dependency) with the same formulas and the same float32 rounding points.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import torch

# Slaney's mel scale: linear below 1 kHz, logarithmic above.
_F_SP = 200.0 / 3
_MIN_LOG_HZ = 1000.0
_MIN_LOG_MEL = _MIN_LOG_HZ / _F_SP
_LOGSTEP = np.log(6.4) / 27.0


@dataclass(frozen=True)
class MelParams:
    sample_rate: int = 24_000
    n_fft: int = 1024
    hop_length: int = 256
    win_length: int = 1024
    n_mels: int = 128
    fmin: float = 0.0
    fmax: float = 12_000.0

    @property
    def pad(self) -> int:
        return (self.n_fft - self.hop_length) // 2

    def num_frames(self, num_samples: int) -> int:
        return (num_samples + 2 * self.pad - self.n_fft) // self.hop_length + 1

    @property
    def min_samples(self) -> int:
        """Shortest input with one frame whose reflect padding is defined (needs more samples than pad)."""
        return max(self.pad + 1, self.n_fft - 2 * self.pad)


# What ``Qwen3TTSForConditionalGeneration.extract_speaker_embedding`` uses.
SPEAKER_MEL = MelParams()


def hz_to_mel(hz: np.ndarray) -> np.ndarray:
    hz = np.asarray(hz, dtype=np.float64)
    linear = hz / _F_SP
    log = _MIN_LOG_MEL + np.log(np.maximum(hz, _MIN_LOG_HZ) / _MIN_LOG_HZ) / _LOGSTEP
    return np.where(hz >= _MIN_LOG_HZ, log, linear)


def mel_to_hz(mel: np.ndarray) -> np.ndarray:
    mel = np.asarray(mel, dtype=np.float64)
    linear = _F_SP * mel
    log = _MIN_LOG_HZ * np.exp(_LOGSTEP * (np.maximum(mel, _MIN_LOG_MEL) - _MIN_LOG_MEL))
    return np.where(mel >= _MIN_LOG_MEL, log, linear)


@functools.lru_cache(maxsize=8)
def _filterbank(sample_rate: int, n_fft: int, n_mels: int, fmin: float, fmax: float) -> np.ndarray:
    fft_freqs = np.fft.rfftfreq(n_fft, d=1.0 / sample_rate)
    edges = mel_to_hz(np.linspace(hz_to_mel(fmin), hz_to_mel(fmax), n_mels + 2))
    widths = np.diff(edges)
    ramps = edges[:, None] - fft_freqs[None, :]
    rising = -ramps[:-2] / widths[:-1, None]
    falling = ramps[2:] / widths[1:, None]
    # librosa stores the triangles in float32 *before* applying the area normalisation in float64, then
    # rounds again; reproducing both rounding points keeps the table bit-identical to librosa's.
    tri = np.maximum(0.0, np.minimum(rising, falling)).astype(np.float32)
    enorm = 2.0 / (edges[2:] - edges[:-2])
    weights = (tri.astype(np.float64) * enorm[:, None]).astype(np.float32)
    weights.setflags(write=False)
    return weights


def slaney_mel_filterbank(
    sample_rate: int, n_fft: int, n_mels: int, fmin: float = 0.0, fmax: float | None = None
) -> np.ndarray:
    """``librosa.filters.mel(sr, n_fft, n_mels, fmin, fmax)`` with its defaults (Slaney scale and area
    norm): float32 ``[n_mels, n_fft // 2 + 1]``."""
    top = sample_rate / 2 if fmax is None else fmax
    if not 0 <= fmin < top <= sample_rate / 2:
        raise ValueError(f"mel band must satisfy 0 <= fmin < fmax <= sr/2, got fmin={fmin}, fmax={top}")
    return _filterbank(int(sample_rate), int(n_fft), int(n_mels), float(fmin), float(top))


def mel_spectrogram(wave: torch.Tensor, params: MelParams = SPEAKER_MEL) -> torch.Tensor:
    """Float waveform ``[B, N]`` -> natural-log mel ``[B, n_mels, frames]`` (fp32, on ``wave``'s device)."""
    if wave.dim() != 2:
        raise ValueError(f"wave must be [batch, samples], got shape {tuple(wave.shape)}")
    if wave.shape[-1] < params.min_samples:
        raise ValueError(f"wave has {wave.shape[-1]} samples; the mel needs at least {params.min_samples}")
    device = wave.device
    x = torch.nn.functional.pad(wave.float()[:, None], (params.pad, params.pad), mode="reflect")[:, 0]
    spec = torch.stft(
        x,
        params.n_fft,
        hop_length=params.hop_length,
        win_length=params.win_length,
        window=torch.hann_window(params.win_length, device=device),
        center=False,
        normalized=False,
        onesided=True,
        return_complex=True,
    )
    mag = torch.sqrt(torch.view_as_real(spec).pow(2).sum(-1) + 1e-9)
    basis = torch.tensor(
        slaney_mel_filterbank(params.sample_rate, params.n_fft, params.n_mels, params.fmin, params.fmax),
        device=device,
    )
    return torch.log(torch.clamp(basis @ mag, min=1e-5))
