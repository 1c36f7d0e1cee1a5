"""Exact stateful streaming decode of the 12 Hz codec over a pool of stream slots.

Why stateful: the decoder's receptive field is ~580 frames (8 window-72 attention layers stacked on causal
convs), so overlap+crop re-decoding is only approximate unless it re-decodes ~46 s per chunk. Keeping each
stream's history instead makes every chunk cost only its new frames, and the concatenated output equals the
single-pass decode up to float rounding.

Per stream the pool holds: the last (k-1)*d inputs of every causal conv, the last ceil(k/s)-1 inputs of every
transposed conv, the last ``sliding_window - 1`` post-RoPE keys/values of every attention layer, and the
absolute frame position (RoPE angles use absolute positions, so a streamed frame sees the same angles as
offline). The pool itself (one flat ``[max_streams, width]`` buffer, gathered and scattered per step) is the
one both TTS codec families use: ``services.codec.slot_pool``.
"""

from __future__ import annotations

from services.codec.slot_pool import SlotPoolDecoder, state_bytes_per_stream

from .decoder import Qwen3TokenizerDecoder

__all__ = ["StreamingDecoder", "state_bytes_per_stream"]


class StreamingDecoder(SlotPoolDecoder[Qwen3TokenizerDecoder]):
    """Slot pool of 12 Hz decoder states (see :class:`SlotPoolDecoder` for the callers' contract)."""
