"""A duplex session's voice recording as PersonaPlex conditions it before Mimi encodes it: resampled to
the session frame's 24 kHz, loudness-normalised to -24 LUFS as the reference does, and right-padded with
zeros to whole 1920-sample frames (numpy only)."""

from __future__ import annotations

import numpy as np

from services.codec.duplex.reference import check_recording
from services.codec.models.mimi.loudness import normalize_loudness
from voxstage.audio import resample
from voxstage.duplex import FRAME_SAMPLES, MAX_RECORDING_SECONDS, SAMPLE_RATE

TARGET_LUFS = -24.0


def prepare_reference(
    pcm: np.ndarray, sample_rate: int, *, max_seconds: float = MAX_RECORDING_SECONDS
) -> np.ndarray:
    """A mono recording at any rate -> float32 at 24 kHz, loudness-normalised to -24 LUFS (silence and clips
    under 400 ms stay as they are), right-padded with zeros to whole 1920-sample frames."""
    x = check_recording(pcm, sample_rate, max_seconds)
    x = normalize_loudness(resample(x, sample_rate, SAMPLE_RATE), SAMPLE_RATE, TARGET_LUFS)
    pad = -x.size % FRAME_SAMPLES
    return np.concatenate([x, np.zeros(pad, np.float32)]).astype(np.float32, copy=False)
