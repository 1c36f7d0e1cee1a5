"""Voice-clone reference clips for the Audio8 codec: validate, mix to mono, resample to 44.1 kHz.

The reference processor resamples the clip to the codec rate before encoding; libsoxr "HQ" is what
librosa's default resampler uses, and the output length is fixed to ``ceil(n * target / orig)``.
"""

from __future__ import annotations

import math

import numpy as np
import soxr
import torch

MAX_SECONDS = 60.0
MAX_CHANNELS = 8  # a 2-D array is [samples, channels]; more columns than this is a transposed array


class ReferenceAudioError(ValueError):
    """A reference clip that cannot be encoded; the message says why."""


def resample(wave: np.ndarray, orig_rate: int, target_rate: int) -> np.ndarray:
    out_len = math.ceil(wave.shape[0] * target_rate / orig_rate)
    out = soxr.resample(np.ascontiguousarray(wave, dtype=np.float32), orig_rate, target_rate, quality="HQ")
    out = out[:out_len] if out.shape[0] >= out_len else np.pad(out, (0, out_len - out.shape[0]))
    return out.astype(np.float32, copy=False)


def prepare_reference(
    pcm: np.ndarray | torch.Tensor, sample_rate: int, target_rate: int, max_seconds: float = MAX_SECONDS
) -> torch.Tensor:
    """Float PCM ``[samples]`` or ``[samples, channels]`` at ``sample_rate`` -> mono float32 CPU tensor
    ``[samples']`` at ``target_rate``."""
    if isinstance(sample_rate, bool) or not isinstance(sample_rate, int | np.integer) or sample_rate <= 0:
        raise ReferenceAudioError(
            f"reference_audio: sample_rate must be a positive integer, got {sample_rate!r}"
        )
    if isinstance(pcm, torch.Tensor):
        pcm = pcm.detach().cpu().numpy()
    if not isinstance(pcm, np.ndarray) or not np.issubdtype(pcm.dtype, np.floating):
        got = pcm.dtype if isinstance(pcm, np.ndarray) else type(pcm).__name__
        raise ReferenceAudioError(f"reference_audio: expected float PCM in [-1, 1], got {got}")
    wave = pcm.astype(np.float32, copy=False)
    if wave.ndim == 2 and 1 <= wave.shape[1] <= MAX_CHANNELS:
        wave = wave.mean(axis=-1, dtype=np.float32)
    if wave.ndim != 1:
        raise ReferenceAudioError(
            f"reference_audio: expected [samples] or [samples, channels<= {MAX_CHANNELS}], "
            f"got shape {tuple(pcm.shape)}"
        )
    if wave.shape[0] == 0:
        raise ReferenceAudioError("reference_audio: the clip is empty")
    if wave.shape[0] / sample_rate > max_seconds:
        raise ReferenceAudioError(
            f"reference_audio: the clip is {wave.shape[0] / sample_rate:.2f} s long; "
            f"the limit is {max_seconds:g} s"
        )
    if not np.isfinite(wave).all():
        raise ReferenceAudioError("reference_audio: the clip contains NaN or infinite samples")
    if int(sample_rate) != target_rate:
        wave = resample(wave, int(sample_rate), target_rate)
    return torch.tensor(wave)  # a copy: the caller's array must not alias what the model reads
