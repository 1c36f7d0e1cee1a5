"""Read one sub-model's tensors out of a larger safetensors checkpoint.

The codec stage needs only ``speaker_encoder.*`` of the main ``model.safetensors`` (1.8-3.8 GB, almost all
talker) and only ``encoder.*`` of the speech tokenizer's file; reading just those keys keeps the talker's
weights out of the codec process. Sharded checkpoints (``*.safetensors.index.json``) are followed.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from voxstage.checkpoint import CheckpointError, read_json


def _shards_for(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    index = path.with_name(path.name + ".index.json")
    if index.is_file():
        weight_map = read_json(index).get("weight_map")
        if not isinstance(weight_map, dict):
            raise CheckpointError(f"{index} has no 'weight_map' object")
        return sorted({path.parent / str(name) for name in weight_map.values()})
    raise CheckpointError(f"missing weights file {path} (and no {index.name})")


def read_prefixed_tensors(
    path: Path, prefix: str, device: str | torch.device = "cpu"
) -> dict[str, torch.Tensor]:
    """All tensors of ``path`` whose key starts with ``prefix`` (keys kept whole, prefix included).

    Returns an empty dict when no key has the prefix; the caller decides whether that is an error.
    """
    out: dict[str, torch.Tensor] = {}
    for shard in _shards_for(path):
        if not shard.is_file():
            raise CheckpointError(f"missing weights shard {shard}")
        try:
            with safe_open(str(shard), framework="pt", device=str(device)) as f:
                for key in f.keys():  # noqa: SIM118 - safe_open handles are not iterable
                    if key.startswith(prefix):
                        out[key] = f.get_tensor(key)
        except SafetensorError as exc:
            raise CheckpointError(f"{shard} is not a readable safetensors file: {exc}") from exc
    return out
