"""Build Mimi from a kyutai checkpoint (strictly), or with seeded random weights; write checkpoints.

A PersonaPlex / Moshi repo ships the codec as ``tokenizer-e351c8d8-checkpoint125.safetensors`` (fp32,
kyutai key names, no config: the architecture is moshi's hard-coded ``_mimi_config``). A tiny or custom
checkpoint directory carries ``mimi_config.json`` (moshi's nested shape) next to its ``tokenizer-*``
file; without one the released config applies. Loading is strict: a missing, unexpected or mis-shaped key
raises :class:`MimiCheckpointError` naming it. The quantizer stays fp32 whatever ``dtype`` is asked for.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import save_file

from voxstage.checkpoint import CheckpointError, load_state_dict_strict, read_json, read_safetensors

from .config import MimiConfig
from .model import MimiModel
from .quantizer import Codebook

CONFIG_NAME = "mimi_config.json"
WEIGHTS_GLOB = "tokenizer-*.safetensors"


class MimiCheckpointError(CheckpointError):
    """A Mimi checkpoint file or directory does not match the model."""


def find_mimi_weights(path: str | Path) -> Path:
    """``path`` itself if it is a file, else the single ``tokenizer-*.safetensors`` in the directory."""
    path = Path(path)
    if path.is_file():
        return path
    if not path.is_dir():
        raise MimiCheckpointError(f"no Mimi checkpoint at {path} (neither a file nor a directory)")
    found = sorted(path.glob(WEIGHTS_GLOB))
    if len(found) != 1:
        names = ", ".join(p.name for p in found) or "none"
        raise MimiCheckpointError(f"{path} must hold exactly one {WEIGHTS_GLOB} file, found {names}")
    return found[0]


def load_mimi_config(path: str | Path) -> MimiConfig:
    """``mimi_config.json`` of a checkpoint directory (or of a weights file's directory), else the released
    config."""
    path = Path(path)
    folder = path if path.is_dir() else path.parent
    config_path = folder / CONFIG_NAME
    if not config_path.is_file():
        return MimiConfig()
    try:
        return MimiConfig.from_dict(read_json(config_path))
    except ValueError as exc:
        raise MimiCheckpointError(f"{config_path}: {exc}") from exc


def _place(model: MimiModel, device: str | torch.device, dtype: torch.dtype) -> MimiModel:
    # Child by child: casting the whole model and then the quantizer back to fp32 would round the
    # codebooks through ``dtype`` on the way.
    for name, child in model.named_children():
        child.to(device=device, dtype=torch.float32 if name == "quantizer" else dtype)
    # Derived tables are computed where they are used, so their rounding is that device's (as the
    # reference's per-call torch.cdist would be).
    model.quantizer.refresh_codebooks()
    return model.eval().requires_grad_(False)


def load_mimi(
    path: str | Path,
    config: MimiConfig | None = None,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
) -> MimiModel:
    """Strictly load a ``tokenizer-*.safetensors`` file or a directory holding exactly one."""
    weights = find_mimi_weights(path)
    config = config or load_mimi_config(path)
    try:
        state = read_safetensors(weights)
    except SafetensorError as exc:
        raise MimiCheckpointError(f"{weights} is not a readable safetensors file: {exc}") from exc
    with torch.device("meta"):
        model = MimiModel(config)
    model.to_empty(device="cpu")
    try:
        load_state_dict_strict(model, state, source=str(weights))
    except CheckpointError as exc:
        raise MimiCheckpointError(str(exc)) from exc
    return _place(model, device, dtype)


def random_init(
    config: MimiConfig,
    seed: int = 0,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
) -> MimiModel:
    """Seeded random Mimi whose every part matters to the output (tests, demos, size-true benchmarks).

    Weights are drawn on ``device`` (a size-true model never round-trips through the host), from one
    generator in ``state_dict`` order, so a (config, seed, device) triple always gives the same model.
    Unlike the reference init (zero codebooks decode to silence; layer scales 0.01 nearly bypass the
    transformers), codebooks, layer scales and norms are drawn too, and conv/linear weights are scaled to keep
    activations O(1) through the stacks and the waveform well inside [-1, 1].
    """
    device = torch.device(device)
    with torch.device("meta"):
        model = MimiModel(config)
    model.to_empty(device=device)
    gen = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for key, tensor in model.state_dict(keep_vars=True).items():
            tensor.copy_(_draw(key, tuple(tensor.shape), gen, device))
        for module in model.quantizer.modules():
            if isinstance(module, Codebook):
                # Stored statistics are vector * usage, so the codebook vectors themselves are N(0, 1).
                module.embedding_sum.mul_(module.cluster_usage[:, None])
    return _place(model, device, dtype)


def _draw(key: str, shape: tuple[int, ...], gen: torch.Generator, device: torch.device) -> torch.Tensor:
    def rand() -> torch.Tensor:
        return torch.rand(shape, generator=gen, device=device)

    def randn() -> torch.Tensor:
        return torch.randn(shape, generator=gen, device=device)

    name = key.rsplit(".", 1)[-1]
    if name == "_initialized":
        return torch.ones(shape, device=device)
    if name == "cluster_usage":
        return rand() * 3 + 0.5  # far from 1, so a lookup that forgot the division is caught
    if name == "embedding_sum":
        return randn()  # times the usage afterwards (see random_init)
    if name == "scale":  # LayerScale
        return rand() * 0.4 + 0.1
    if ".norm" in key:
        return 1 + 0.1 * randn() if name == "weight" else 0.05 * randn()
    if name == "bias":
        return 0.05 * randn()
    if key.endswith("convtr.weight"):  # [in, out/groups, k]: each output sums ~in * k / stride taps
        std = 1.0 / math.sqrt(max(1, shape[0] * shape[2] // 2))
    else:
        std = 1.0 / math.sqrt(math.prod(shape[1:]))
    if key.startswith("decoder.model.") and shape[0] == 1:
        std *= 0.5  # last decoder conv: keep the waveform well inside [-1, 1]
    return randn() * std


def mimi_checkpoint_state(model: MimiModel) -> dict[str, torch.Tensor]:
    """The model's weights under the kyutai checkpoint keys, as contiguous fp32 CPU tensors."""
    return {
        k: v.detach().to(device="cpu", dtype=torch.float32).contiguous().clone()
        for k, v in model.state_dict().items()
    }


def write_mimi_checkpoint(
    model: MimiModel, out_dir: str | Path, name: str = "tokenizer-mimi.safetensors"
) -> Path:
    """Write ``name`` (kyutai layout) and ``mimi_config.json`` into ``out_dir``; return the weights path."""
    if not (name.startswith("tokenizer-") and name.endswith(".safetensors")):
        raise ValueError(f"name must match {WEIGHTS_GLOB} so load_mimi finds it, got {name!r}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / name
    save_file(mimi_checkpoint_state(model), str(path))
    (out / CONFIG_NAME).write_text(json.dumps(model.config.to_dict(), indent=2) + "\n")
    return path
