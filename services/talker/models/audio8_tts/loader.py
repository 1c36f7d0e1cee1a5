"""Loading the Audio8-TTS talker from a released checkpoint directory, random initialisation, and writing
checkpoints in the released layout (presets, tests).

Layout read (models.md §2.1): ``config.json`` (flat DualAR fields), ``model.safetensors`` (flat keys, no
prefix; a sharded ``model.safetensors.index.json`` is accepted too), optionally ``generation_config.json``
and the tokenizer files. ``codec.pth`` belongs to the codec stage. Weights load strictly: any missing,
unexpected or mis-shaped key raises ``CheckpointError`` naming it; rotary buffers a checkpoint may carry
(``*freqs_cis``) are recomputed, so they are skipped.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from services.talker.checkpoint import init_like_reference, read_weights
from voxstage.checkpoint import CheckpointError, build_module, load_state_dict_strict

from .config import (
    CONFIG_FILE,
    GENERATION_CONFIG_FILE,
    WEIGHTS_FILE,
    Audio8TalkerConfig,
    parse_config,
    read_config,
)
from .model import RELEASED_ROPE_DTYPE, Audio8TTSModel
from .tokenizer import Audio8Tokenizer

INIT_STD = 0.02  # the DualAR reference's initializer_range
SKIPPED_SUFFIXES = ("freqs_cis",)  # rotary tables some exports persist; recomputed here


def build_model(
    config: Audio8TalkerConfig,
    device: torch.device | str,
    dtype: torch.dtype,
    rope_dtype: torch.dtype = RELEASED_ROPE_DTYPE,
) -> Audio8TTSModel:
    """The module tree on ``device`` in ``dtype`` (``meta``: no memory, e.g. to count parameters)."""
    return build_module(lambda: Audio8TTSModel(config, rope_dtype=rope_dtype), device, dtype)


def load_weights(model: Audio8TTSModel, state: dict[str, torch.Tensor], source: str) -> None:
    """Strict copy of ``state`` (checkpoint key names) into ``model``, then the compact head is sliced."""
    skipped = [k for k in state if k.endswith(SKIPPED_SUFFIXES)]
    load_state_dict_strict(model, state, source=source, ignore=skipped)
    model.refresh_head()


def load_audio8_talker(
    checkpoint_dir: Path | str,
    *,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    rope_dtype: torch.dtype = RELEASED_ROPE_DTYPE,
) -> tuple[Audio8TTSModel, Audio8TalkerConfig, Audio8Tokenizer | None]:
    """``(model, config, tokenizer)`` from a checkpoint directory; the tokenizer is None when the directory
    has no ``tokenizer.json`` (a weights-only export: requests then need pre-tokenized prompts)."""
    checkpoint_dir = Path(checkpoint_dir)
    if not checkpoint_dir.is_dir():
        raise CheckpointError(f"checkpoint directory {checkpoint_dir} does not exist")
    config = read_config(checkpoint_dir)
    tokenizer = None
    if (checkpoint_dir / "tokenizer.json").is_file():
        tokenizer = Audio8Tokenizer.from_dir(checkpoint_dir)
    # Built on the device and copied into (0.6 B params: the transient host copy is 1.2 GB in bf16); an
    # in-place copy keeps the fused [w1 | w3] feed-forward weights intact.
    model = build_model(config, device, dtype, rope_dtype)
    load_weights(model, read_weights(checkpoint_dir), source=str(checkpoint_dir / WEIGHTS_FILE))
    return model, config, tokenizer


@torch.no_grad()
def random_init(
    config: Audio8TalkerConfig,
    seed: int,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    rope_dtype: torch.dtype = RELEASED_ROPE_DTYPE,
) -> Audio8TTSModel:
    """Seeded weights with the reference's init (N(0, 0.02) matrices and embeddings, zero biases, unit
    norms), drawn on ``device`` from a generator seeded with ``seed``: the size-true preset never writes
    weights to disk. The same seed gives the same model on the same device type."""
    model = build_model(config, device, dtype, rope_dtype)
    init_like_reference(model, seed, device, INIT_STD)
    model.refresh_head()
    return model


def checkpoint_state(model: Audio8TTSModel) -> dict[str, torch.Tensor]:
    """The model's weights under their checkpoint names (flat ``model.safetensors`` keys)."""
    return {k: v.detach().contiguous() for k, v in model.state_dict().items()}


def save_checkpoint(
    out_dir: Path | str,
    model: Audio8TTSModel,
    config_dict: dict[str, Any],
    *,
    generation: dict[str, Any] | None = None,
    dtype: torch.dtype = torch.bfloat16,
) -> Path:
    """Write ``config.json``, ``model.safetensors`` (``dtype``; bf16 as released) and, if given,
    ``generation_config.json`` into ``out_dir`` (the released layout; tokenizer files are the caller's)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    parse_config(config_dict, source="save_checkpoint")  # never write a file the loader would refuse
    (out / CONFIG_FILE).write_text(json.dumps(config_dict, indent=2) + "\n")
    if generation is not None:
        (out / GENERATION_CONFIG_FILE).write_text(json.dumps(generation, indent=2) + "\n")
    tensors = {k: v.to(dtype) for k, v in checkpoint_state(model).items()}
    save_file(tensors, str(out / WEIGHTS_FILE), metadata={"format": "pt"})
    return out
