"""Codec side of the Audio8 presets: geometries, the ``config.json`` codec fields, the tiny ``codec.pth``.

* ``audio8-tts-tiny``: ``Audio8CodecConfig.tiny()`` (post dim 64, 2 layers, 4 q / 2 kv heads; decoder
  width 96; encoder 4 -> 64 channels) with the real rates, strides, codebooks and 128-frame window, so it
  runs fast on CPU yet streams exactly like the released codec. Its seeded weights are written as
  ``codec.pth`` in the released layout, so it loads through the same strict loader as a real checkpoint.
* ``audio8-tts-0.6b``: the released geometry (about 130 M decode-side, 340 M total parameters); a preset
  directory carries only ``config.json`` and the codec stage draws the weights on its device
  (``loader.random_init`` with the preset seed).

A preset's top-level ``config.json`` must carry :func:`codec_config_fields` (the released field names).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .config import Audio8CodecConfig
from .loader import CODEC_FILENAME, random_init, save_codec_checkpoint

CODEC_PRESETS: tuple[str, ...] = ("audio8-tts-tiny", "audio8-tts-0.6b")


def tiny_config() -> Audio8CodecConfig:
    return Audio8CodecConfig.tiny()


def released_config() -> Audio8CodecConfig:
    return Audio8CodecConfig.released()


def codec_preset(preset: str) -> Audio8CodecConfig:
    if preset not in CODEC_PRESETS:
        raise ValueError(f"unknown Audio8 preset {preset!r}; known presets: {', '.join(CODEC_PRESETS)}")
    return tiny_config() if preset == "audio8-tts-tiny" else released_config()


def codec_config_fields(config: Audio8CodecConfig) -> dict[str, Any]:
    """The ``codec_*`` fields of the top-level ``config.json`` (released names; merge them into the talker's
    fields, which also carry ``codebook_size`` 4096 and ``num_codebooks`` 10)."""
    return {
        "codec_filename": CODEC_FILENAME,
        "codec_sample_rate": config.sample_rate,
        "codec_frame_size": config.samples_per_frame,
        "codec_post_n_layer": config.post.layers,
        "codec_post_n_head": config.post.heads,
        "codec_post_n_local_heads": config.post.kv_heads,
        "codec_post_intermediate_size": config.post.ffn,
    }


def write_tiny_codec(out_dir: str | Path, seed: int) -> Path:
    """Draw the tiny codec with ``seed`` (on the CPU) and write ``<out_dir>/codec.pth``; returns its path."""
    return save_codec_checkpoint(random_init(tiny_config(), seed), out_dir)
