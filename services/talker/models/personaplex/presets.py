"""Talker-side presets of PersonaPlex, in the released directory layout.

* ``personaplex-tiny``: the real architecture at toy width (the size the golden fixtures use), context
  3000, a tiny SentencePiece tokenizer and two stored voices; seeded random weights on disk.
* ``personaplex-7b``: the released 7B config (an empty ``config.json``, as shipped) with random weights
  drawn on the device at load; its voices are made at load from seeded codes.

The Mimi half of a preset (``tokenizer-*.safetensors``, ``mimi_config.json``) is the codec stage's.
"""

from __future__ import annotations

from typing import Any

import numpy as np

TINY_LM: dict[str, Any] = {
    "dim": 64,
    "num_heads": 4,
    "num_layers": 2,
    "text_card": 200,
    "depformer_dim": 32,
    "depformer_num_heads": 2,
    "depformer_num_layers": 2,
    "depformer_dim_feedforward": 132,
}
PRESETS: dict[str, dict[str, Any]] = {"personaplex-tiny": TINY_LM, "personaplex-7b": {}}
# Stored-voice names of the presets (two of the released eighteen); their codes are seeded random.
PRESET_VOICES: tuple[str, ...] = ("NATF0", "NATM0")
VOICE_FRAMES = 24


def preset_config(name: str) -> dict[str, Any]:
    if name not in PRESETS:
        raise ValueError(f"unknown PersonaPlex preset {name!r}; expected one of {sorted(PRESETS)}")
    return dict(PRESETS[name])


def voice_codes(name: str, card: int = 2048) -> np.ndarray:
    """Seeded Mimi codes ``[VOICE_FRAMES, 8]`` standing in for a voice WAV (deterministic per name)."""
    seed = int.from_bytes(name.encode(), "little") % (2**32)
    return np.random.default_rng(seed).integers(0, card, size=(VOICE_FRAMES, 8), dtype=np.int64)
