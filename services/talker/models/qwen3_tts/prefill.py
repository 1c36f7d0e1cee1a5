"""Prompt prefill of the Qwen3-TTS adapter: the shared runner (``services.talker.prefill``), which batches
one tick's prefill chunks into as few padded (graph-capturable) forwards as possible."""

from __future__ import annotations

from services.talker.prefill import (
    MAX_LENGTH,
    MAX_ROWS,
    MAX_TOKENS,
    MIN_LENGTH,
    Prefill,
    PrefillChunk,
    bucket,
)

__all__ = ["MAX_LENGTH", "MAX_ROWS", "MAX_TOKENS", "MIN_LENGTH", "Prefill", "PrefillChunk", "bucket"]
