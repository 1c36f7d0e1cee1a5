"""Stateless overlap+crop decode: re-decode ``left_context`` old frames with the new ones, keep the new part.

This is the fallback for codecs without streaming state, and the baseline that shows why the 12 Hz codec
streams statefully: its receptive field is ~580 frames, so any practical left context only approximates the
single-pass output (see ``tests/unit/codec/test_qwen3_tts_decoder_stateless.py`` for measured errors).
"""

from __future__ import annotations

import torch

from .decoder import Qwen3TokenizerDecoder


@torch.inference_mode()
def decode_with_left_context(
    model: Qwen3TokenizerDecoder, context: torch.Tensor, new: torch.Tensor
) -> torch.Tensor:
    """Decode ``context ++ new`` (``[B, Q, L]`` and ``[B, Q, T]``) from position 0 and return only the
    ``T * samples_per_frame`` samples of the new frames."""
    if context.dim() != 3 or new.dim() != 3 or context.shape[:2] != new.shape[:2]:
        raise ValueError(
            f"context and new must be [batch, quantizers, frames] with equal batch and quantizers, "
            f"got {tuple(context.shape)} and {tuple(new.shape)}"
        )
    wav = model(torch.cat([context, new], dim=-1))
    return wav[:, context.shape[-1] * model.samples_per_frame :]


def stream_stateless(
    model: Qwen3TokenizerDecoder, codes: torch.Tensor, chunk_frames: int, left_context: int
) -> torch.Tensor:
    """Decode ``codes`` [B, Q, F] in chunks of ``chunk_frames``, each with up to ``left_context`` earlier
    frames re-decoded and cropped; returns the concatenated ``[B, F * samples_per_frame]`` waveform."""
    if chunk_frames < 1:
        raise ValueError(f"chunk_frames must be >= 1, got {chunk_frames}")
    if left_context < 0:
        raise ValueError(f"left_context must be >= 0, got {left_context}")
    pieces = []
    for start in range(0, codes.shape[-1], chunk_frames):
        ctx_start = max(0, start - left_context)
        pieces.append(
            decode_with_left_context(
                model, codes[..., ctx_start:start], codes[..., start : start + chunk_frames]
            )
        )
    return torch.cat(pieces, dim=-1)
