"""What the codec stage asks of Audio8-TTS (named by ``voxstage.families.audio8_tts``): the loaded codec
runtime, and the codec's part of a preset directory (its ``config.json`` fields and ``codec.pth``)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from services.codec.models import CodecRuntime
from voxstage.checkpoint import read_json
from voxstage.families import Preset
from voxstage.presets import ModelSource

from . import loader
from .presets import codec_config_fields, codec_preset, write_tiny_codec
from .streaming import Audio8StreamingDecoder


def load_codec(
    source: ModelSource, *, device: str | torch.device, dtype: torch.dtype, max_streams: int
) -> CodecRuntime:
    """One ``codec.pth`` holds both halves, so the decoder pool and the reference-audio encoder share one
    model. Voice cloning needs only the reference codes (no speaker encoder). The talker samples every
    codebook over 4096 classes; the codec clamps residual codes."""
    if source.random_init:
        # Size-true preset: config.json only; weights drawn on the device with the preset seed.
        config = loader.config_from_json(read_json(source.path / "config.json"))
        model = loader.random_init(config, source.seed, device=device, dtype=dtype)
    else:
        model = loader.load_audio8_codec(source.path, device=device, dtype=dtype)
    cfg = model.config
    pool = Audio8StreamingDecoder(model, 2 * max_streams)
    return CodecRuntime(
        family="audio8_tts",
        model=source.name,
        decoder=pool,
        encoder=model,
        speaker_encoder=None,
        num_groups=cfg.num_codebooks,
        codebook_size=cfg.semantic_codebook_size,
        sample_rate=cfg.sample_rate,
        samples_per_frame=cfg.samples_per_frame,
        decoder_window_frames=cfg.window,
        state_bytes_per_stream=pool.state_bytes_per_stream(),
        clone_from_codes=True,  # the reference's codes and transcript become prompt frames (models.md §2.4)
        decoder_snapshots=True,  # the slot pool's state is all a stream carries (streaming.py)
    )


def write_preset(preset: Preset, out: Path, seed: int) -> None:
    """After the talker's files: the preset's codec geometry over the released ``codec_*`` fields of the
    one flat ``config.json`` (tiny: 2 post layers), and for the tiny preset its seeded ``codec.pth``."""
    config = read_json(out / "config.json")
    merged = {**config, **codec_config_fields(codec_preset(preset.name))}
    (out / "config.json").write_text(json.dumps(merged, indent=2) + "\n")
    if not preset.random_init:
        write_tiny_codec(out, seed=seed + 1)
