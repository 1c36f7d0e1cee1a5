"""Checkpoint pieces shared by the talker families with Hugging Face-style layouts (Qwen3-TTS, Audio8-TTS),
on top of the strict loading of ``voxstage.checkpoint``."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from voxstage.checkpoint import CheckpointError, read_json, read_safetensors

WEIGHTS_FILE = "model.safetensors"
WEIGHTS_INDEX_FILE = "model.safetensors.index.json"


def read_weights(checkpoint_dir: Path) -> dict[str, torch.Tensor]:
    """Every tensor of ``model.safetensors``, or of the shards a ``model.safetensors.index.json`` names."""
    single = checkpoint_dir / WEIGHTS_FILE
    index = checkpoint_dir / WEIGHTS_INDEX_FILE
    if single.is_file():
        return read_safetensors(single)
    if index.is_file():
        weight_map = read_json(index).get("weight_map")
        if not isinstance(weight_map, dict):
            raise CheckpointError(f"{index}: weight_map must be an object")
        state: dict[str, torch.Tensor] = {}
        for shard in sorted(set(weight_map.values())):
            state.update(read_safetensors(checkpoint_dir / str(shard)))
        return state
    raise CheckpointError(f"missing weights file {single} (or {index})")


@torch.no_grad()
def init_like_reference(model: nn.Module, seed: int, device: torch.device | str, std: float) -> None:
    """The Qwen-style reference init in place: N(0, ``std``) matrices and embeddings, zero biases, unit
    norms, drawn in sorted parameter order from a generator on ``device`` seeded with ``seed`` (the same seed
    gives the same weights on the same device type)."""
    gen = torch.Generator(device=torch.device(device)).manual_seed(seed)
    for name, param in sorted(model.named_parameters()):
        if name.endswith("bias"):
            param.zero_()
        elif name.endswith("norm.weight"):
            param.fill_(1.0)
        else:
            param.normal_(0.0, std, generator=gen)
