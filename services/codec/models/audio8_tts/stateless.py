"""Stateless overlap+crop decoding, the way vllm-omni streams this codec (seed ``audio8_tts.yaml``).

Each chunk re-decodes up to ``left_context`` earlier frames from position 0 together with its new frames,
and keeps only the new frames' samples. Because the decode half's receptive field is ~1025 frames
(8 x 127 attention steps + 9 conv frames), any practical left context only approximates the single-pass
decode; ``Audio8StreamingDecoder`` is the exact alternative. This module exists so the difference can be
measured (``tests/unit/codec/test_audio8_streaming.py``).

Schedule (vllm-omni's, models.md / vllm-omni.md §3.3): while fewer than ``(chunk // initial) * initial``
frames are out, emit every ``initial`` frames, re-decoding the *whole* prefix (so these chunks are exact);
after that emit ``chunk`` frames at a time with ``min(left_context, emitted)`` frames of context; the
remainder goes out at the end. With this codec every window gives exactly ``frames x 2048`` samples, so
vllm-omni's proportional crop ``round(context / frames x len(wav))`` is exactly ``context x 2048``.
"""

from __future__ import annotations

import torch

from services.codec.stateless import decode_windows, decode_with_left_context

from .codec import Audio8Codec

__all__ = ["decode_with_left_context", "overlap_crop_schedule", "stream_overlap_crop"]


def overlap_crop_schedule(
    total: int, chunk_frames: int, left_context: int, initial_frames: int
) -> list[tuple[int, int, int]]:
    """``(context_start, start, end)`` of each window: frames ``[context_start, end)`` are decoded and the
    output of ``[start, end)`` is kept."""
    if not 1 <= initial_frames <= chunk_frames:
        raise ValueError(f"need 1 <= initial_frames ({initial_frames}) <= chunk_frames ({chunk_frames})")
    if left_context < 0:
        raise ValueError(f"left_context must be >= 0, got {left_context}")
    coverage = (chunk_frames // initial_frames) * initial_frames
    windows, emitted = [], 0
    while emitted < total:
        if emitted < coverage:
            end, ctx_start = min(emitted + initial_frames, total), 0
        else:
            end, ctx_start = min(emitted + chunk_frames, total), max(0, emitted - left_context)
        windows.append((ctx_start, emitted, end))
        emitted = end
    return windows


def stream_overlap_crop(
    model: Audio8Codec, codes: torch.Tensor, chunk_frames: int, left_context: int, initial_frames: int
) -> torch.Tensor:
    """Decode ``codes`` [B, 10, F] with the overlap+crop schedule; returns ``[B, F * 2048]``."""
    windows = overlap_crop_schedule(codes.shape[-1], chunk_frames, left_context, initial_frames)
    return decode_windows(model, codes, windows)
