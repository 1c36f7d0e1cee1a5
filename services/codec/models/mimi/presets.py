"""Mimi configs of the PersonaPlex presets.

* ``personaplex-tiny``: models.md §3.5 (SEANet dimension 32 / 4 filters; transformer d_model 32, 2 heads,
  2 layers, ff 64; quantizer dimension 16; 8 of 32 codebooks used; everything else as released: 24 kHz,
  12.5 Hz, 1920 samples per frame, 2048-entry codebooks, 250-step context), so it runs fast on CPU and
  streams exactly like the released codec. The golden fixtures use this config.
* ``personaplex-7b``: the released ``tokenizer-e351c8d8-checkpoint125`` (79.3 M parameters).

:func:`mimi_config_dict` gives moshi's nested ``_mimi_config`` shape, written as ``mimi_config.json`` next to
tiny checkpoints.
"""

from __future__ import annotations

from typing import Any

from .config import MimiConfig

MIMI_PRESETS: tuple[str, ...] = ("personaplex-tiny", "personaplex-7b")

TINY_OVERRIDES: dict[str, Any] = {
    "seanet": {"dimension": 32, "n_filters": 4},
    "transformer": {
        "d_model": 32,
        "num_heads": 2,
        "num_layers": 2,
        "dim_feedforward": 64,
        "input_dimension": 32,
        "output_dimensions": [32],
    },
    "quantizer": {"dimension": 16, "input_dimension": 32, "output_dimension": 32},
}


def tiny_config() -> MimiConfig:
    return MimiConfig().with_overrides(TINY_OVERRIDES)


def full_config() -> MimiConfig:
    return MimiConfig()


def mimi_preset(preset: str) -> MimiConfig:
    """The typed config of ``preset``."""
    if preset not in MIMI_PRESETS:
        raise ValueError(f"unknown Mimi preset {preset!r}; known presets: {', '.join(MIMI_PRESETS)}")
    return tiny_config() if preset == "personaplex-tiny" else full_config()


def mimi_config_dict(preset: str) -> dict[str, Any]:
    """``mimi_config.json`` content of ``preset`` (moshi's nested shape; a fresh dict each call)."""
    return mimi_preset(preset).to_dict()
