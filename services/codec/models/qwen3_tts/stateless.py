"""Stateless overlap+crop decode: re-decode ``left_context`` old frames with the new ones, keep the new part.

This is the fallback for codecs without streaming state, and the baseline that shows why the 12 Hz codec
streams statefully: its receptive field is ~580 frames, so any practical left context only approximates the
single-pass output (see ``tests/unit/codec/test_qwen3_tts_decoder_stateless.py`` for measured errors). The
decoding of each window is shared with Audio8 (``services.codec.stateless``); the fixed-chunk schedule is
this family's.
"""

from __future__ import annotations

import torch

from services.codec.stateless import decode_windows, decode_with_left_context

from .decoder import Qwen3TokenizerDecoder

__all__ = ["decode_with_left_context", "stream_stateless"]


def stream_stateless(
    model: Qwen3TokenizerDecoder, codes: torch.Tensor, chunk_frames: int, left_context: int
) -> torch.Tensor:
    """Decode ``codes`` [B, Q, F] in chunks of ``chunk_frames``, each with up to ``left_context`` earlier
    frames re-decoded and cropped; returns the concatenated ``[B, F * samples_per_frame]`` waveform."""
    if chunk_frames < 1:
        raise ValueError(f"chunk_frames must be >= 1, got {chunk_frames}")
    if left_context < 0:
        raise ValueError(f"left_context must be >= 0, got {left_context}")
    total = codes.shape[-1]
    windows = [
        (max(0, start - left_context), start, min(start + chunk_frames, total))
        for start in range(0, total, chunk_frames)
    ]
    return decode_windows(model, codes, windows)
