"""Stateless overlap+crop decoding for any codec decoder: re-decode some earlier frames from position 0
together with the new ones, and keep only the new frames' samples.

It is only exact when the re-decoded context covers the decoder's receptive field, which for both TTS codecs
is far longer than any practical context (hundreds of frames), so it serves as the measured baseline against
the exact stateful streaming (``slot_pool.py``). The families' schedules (a fixed chunk for Qwen3-TTS,
vllm-omni's growing chunks for Audio8) live in their ``stateless.py``; the decoding of each window is here.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

import torch


class OfflineDecoder(Protocol):
    """A codec decoder whose call decodes ``[B, Q, F]`` codes from frame 0 into ``[B, F * spf]`` samples."""

    @property
    def samples_per_frame(self) -> int: ...

    def __call__(self, codes: torch.Tensor) -> torch.Tensor: ...


@torch.inference_mode()
def decode_with_left_context(model: OfflineDecoder, context: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
    """Decode ``context ++ new`` (``[B, Q, L]`` and ``[B, Q, T]``) from position 0 and return only the
    ``T * samples_per_frame`` samples of the new frames."""
    if context.dim() != 3 or new.dim() != 3 or context.shape[:2] != new.shape[:2]:
        raise ValueError(
            f"context and new must be [batch, quantizers, frames] with equal batch and quantizers, "
            f"got {tuple(context.shape)} and {tuple(new.shape)}"
        )
    wav = model(torch.cat([context, new], dim=-1))
    return wav[:, context.shape[-1] * model.samples_per_frame :]


def decode_windows(
    model: OfflineDecoder, codes: torch.Tensor, windows: Iterable[tuple[int, int, int]]
) -> torch.Tensor:
    """Decode ``codes`` [B, Q, F] window by window: for each ``(context_start, start, end)`` frames
    ``[context_start, end)`` are decoded and the samples of ``[start, end)`` kept; returns them concatenated
    (``[B, F * samples_per_frame]`` when the windows tile ``[0, F)``)."""
    pieces = [decode_with_left_context(model, codes[..., a:s], codes[..., s:e]) for a, s, e in windows]
    return torch.cat(pieces, dim=-1)
