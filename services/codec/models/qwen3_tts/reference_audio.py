"""Validation, mono mixing and resampling of a voice-clone reference clip.

Both reference-audio networks (the tokenizer encoder and the speaker encoder) take mono float PCM at
24 kHz. User audio arrives at any rate and channel count, so it is checked and converted here once, with
errors that say what is wrong, before any model runs.
"""

from __future__ import annotations

import math

import numpy as np
import soxr
import torch

MODEL_SAMPLE_RATE = 24_000
DEFAULT_MAX_SECONDS = 60.0
# A 2-D array is (samples, channels), as soundfile returns it. More channels than this means the array is
# almost certainly (channels, samples) and mixing it would silently average time away.
MAX_CHANNELS = 8


class ReferenceAudioError(ValueError):
    """Reference audio that cannot be used; the message names the field and the problem."""


def resample(wave: np.ndarray, orig_rate: int, target_rate: int) -> np.ndarray:
    """Resample 1-D float32 audio exactly as the reference does (``librosa.resample`` defaults: libsoxr
    "HQ", output length fixed to ``ceil(n * target / orig)``), so a 44.1/48/16 kHz clip yields the same
    codes and x-vector as in qwen-tts, not merely similar ones."""
    out_len = math.ceil(wave.shape[0] * target_rate / orig_rate)
    out = soxr.resample(np.ascontiguousarray(wave, dtype=np.float32), orig_rate, target_rate, quality="HQ")
    if out.shape[0] >= out_len:
        return out[:out_len].astype(np.float32, copy=False)
    return np.pad(out, (0, out_len - out.shape[0])).astype(np.float32, copy=False)


def prepare_reference_audio(
    audio: np.ndarray | torch.Tensor,
    sample_rate: int,
    *,
    max_seconds: float = DEFAULT_MAX_SECONDS,
    min_samples: int = 1,
    target_rate: int = MODEL_SAMPLE_RATE,
    field: str = "reference_audio",
) -> torch.Tensor:
    """Return the clip as a 1-D float32 CPU tensor at ``target_rate``.

    ``audio`` is float PCM, shape ``[samples]`` or ``[samples, channels]`` (channels are averaged, as the
    reference does). ``max_seconds`` bounds the input duration; ``min_samples`` is the shortest clip (after
    resampling) the consumer can process.
    """
    if isinstance(sample_rate, bool) or not isinstance(sample_rate, int | np.integer) or sample_rate <= 0:
        raise ReferenceAudioError(f"{field}: sample_rate must be a positive integer, got {sample_rate!r}")
    sample_rate = int(sample_rate)
    if not (isinstance(max_seconds, int | float) and max_seconds > 0):
        raise ReferenceAudioError(f"{field}: max_seconds must be positive, got {max_seconds!r}")
    if isinstance(audio, torch.Tensor):
        if not audio.is_floating_point():
            raise ReferenceAudioError(f"{field}: expected float PCM in [-1, 1], got a {audio.dtype} tensor")
        wave = audio.detach().to("cpu", torch.float32).numpy()
    elif isinstance(audio, np.ndarray):
        if not np.issubdtype(audio.dtype, np.floating):
            raise ReferenceAudioError(f"{field}: expected float PCM in [-1, 1], got a {audio.dtype} array")
        wave = audio.astype(np.float32, copy=False)
    else:
        raise ReferenceAudioError(
            f"{field}: expected a numpy array or torch tensor, got {type(audio).__name__}"
        )

    if wave.ndim not in (1, 2):
        raise ReferenceAudioError(
            f"{field}: expected shape [samples] or [samples, channels], got {tuple(wave.shape)}"
        )
    if wave.ndim == 2:
        if wave.shape[1] == 0 or wave.shape[1] > MAX_CHANNELS:
            raise ReferenceAudioError(
                f"{field}: 2-D audio must be [samples, channels] with 1..{MAX_CHANNELS} channels, got shape "
                f"{tuple(wave.shape)} (transpose a [channels, samples] array first)"
            )
    if wave.shape[0] == 0:
        raise ReferenceAudioError(f"{field}: the clip is empty")
    duration = wave.shape[0] / sample_rate
    if duration > max_seconds:
        raise ReferenceAudioError(
            f"{field}: the clip is {duration:.2f} s long; the limit is {max_seconds:g} s"
        )
    if not np.isfinite(wave).all():
        raise ReferenceAudioError(f"{field}: the clip contains NaN or infinite samples")
    if wave.ndim == 2:
        wave = wave.mean(axis=-1, dtype=np.float32)

    if sample_rate != target_rate:
        wave = resample(wave, sample_rate, target_rate)
    if wave.shape[0] < min_samples:
        raise ReferenceAudioError(
            f"{field}: the clip is too short: {wave.shape[0]} samples at {target_rate} Hz "
            f"({1000 * wave.shape[0] / target_rate:.1f} ms); at least {min_samples} "
            f"({math.ceil(1000 * min_samples / target_rate)} ms) are needed"
        )
    return torch.tensor(wave)  # a copy: the caller's array must not alias what the models read
