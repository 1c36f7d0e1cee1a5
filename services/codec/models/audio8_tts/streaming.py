"""Exact stateful streaming decode of the Audio8 codec over a pool of stream slots.

Why stateful: the decode half's receptive field is ~1025 frames (8 window-128 attention layers on top of
the causal convs), so overlap+crop re-decoding (``stateless.py``) only approximates the single-pass output
unless each chunk re-decodes ~48 s. Keeping each stream's history instead costs only its new frames, and the
concatenated output equals the offline decode up to float rounding.

Per stream the pool holds: the last ``(k-1)*d`` inputs of every stride-1 causal conv (ConvNeXt depthwise
convs, residual units, the decoder's first and last convs), the last ``ceil(k/s) - 1`` inputs of every
transposed conv (one step for the decoder's k=2s convs, none for the k2 s2 upsamplers), the last 127
post-RoPE keys and values of each post-module layer, and the absolute frame position (RoPE angles use it).
Released geometry, fp32: about 4.7 MB per stream (4.2 MB of it K/V). The pool itself (one flat
``[max_streams, width]`` buffer, gathered and scattered per step) is the one both TTS codec families use:
``services.codec.slot_pool``.
"""

from __future__ import annotations

from services.codec.slot_pool import SlotPoolDecoder, state_bytes_per_stream

from .codec import Audio8Codec

__all__ = ["Audio8StreamingDecoder", "state_bytes_per_stream"]


class Audio8StreamingDecoder(SlotPoolDecoder[Audio8Codec]):
    """Slot pool of Audio8 decode states (see :class:`SlotPoolDecoder` for the callers' contract)."""
