"""Loading the Qwen3-TTS talker from a real checkpoint directory, and random initialisation.

Layout read: ``config.json``, ``generation_config.json``, ``model.safetensors`` (or a sharded
``model.safetensors.index.json``) and the text tokenizer files. Weight keys must start with ``talker.``;
``speaker_encoder.*`` belongs to the codec stage and is skipped here; any other key is an error, as is any
missing, unexpected or mis-shaped ``talker.*`` key (the message names them with their checkpoint names).
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from services.talker.checkpoint import init_like_reference, read_weights
from voxstage.checkpoint import CheckpointError, build_module, load_state_dict_strict, read_json

from .config import Qwen3TTSConfig, parse_config
from .model import Qwen3TTSTalker
from .tokenizer import QwenTextTokenizer

TALKER_PREFIX = "talker."
OTHER_STAGE_PREFIXES = ("speaker_encoder.",)  # loaded by the codec stage
INIT_STD = 0.02  # the reference's initializer_range


def read_config(checkpoint_dir: Path) -> Qwen3TTSConfig:
    checkpoint_dir = Path(checkpoint_dir)
    config_path = checkpoint_dir / "config.json"
    # The reference reads generation_config.json unconditionally; so do we.
    generation = read_json(checkpoint_dir / "generation_config.json")
    return parse_config(read_json(config_path), generation, source=str(config_path))


def build_model(config: Qwen3TTSConfig, device: torch.device | str, dtype: torch.dtype) -> Qwen3TTSTalker:
    return build_module(lambda: Qwen3TTSTalker(config), device, dtype)


class _Holder(nn.Module):
    """Gives the talker its checkpoint prefix so strict-loading errors use the checkpoint's key names."""

    def __init__(self, talker: Qwen3TTSTalker) -> None:
        super().__init__()
        self.talker = talker


def load_talker_weights(model: Qwen3TTSTalker, state: dict[str, torch.Tensor], source: str) -> None:
    foreign = [k for k in state if not k.startswith(TALKER_PREFIX) and not k.startswith(OTHER_STAGE_PREFIXES)]
    if foreign:
        shown = ", ".join(sorted(foreign)[:12])
        raise CheckpointError(f"{source} has keys outside talker.* / speaker_encoder.*: {shown}")
    talker_state = {k: v for k, v in state.items() if k.startswith(TALKER_PREFIX)}
    load_state_dict_strict(_Holder(model), talker_state, source=source)


def load_qwen3_tts_talker(
    checkpoint_dir: Path | str,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
) -> tuple[Qwen3TTSTalker, Qwen3TTSConfig, QwenTextTokenizer]:
    """Load ``(model, config, tokenizer)`` from a Qwen3-TTS checkpoint directory (real layout)."""
    checkpoint_dir = Path(checkpoint_dir)
    if not checkpoint_dir.is_dir():
        raise CheckpointError(f"checkpoint directory {checkpoint_dir} does not exist")
    config = read_config(checkpoint_dir)
    tokenizer = QwenTextTokenizer.from_dir(checkpoint_dir)
    missing = [
        name
        for name, tid in (
            ("im_start_token_id", config.im_start_token_id),
            ("tts_pad_token_id", config.tts_pad_token_id),
            ("tts_bos_token_id", config.tts_bos_token_id),
            ("tts_eos_token_id", config.tts_eos_token_id),
        )
        if tid not in tokenizer.special_ids.values()
    ]
    if missing:
        raise CheckpointError(f"{checkpoint_dir}: tokenizer_config.json lacks {', '.join(missing)}")
    model = build_model(config, device, dtype)
    weights = read_weights(checkpoint_dir)
    load_talker_weights(model, weights, source=str(checkpoint_dir / "model.safetensors"))
    return model, config, tokenizer


@torch.no_grad()
def random_init(
    config: Qwen3TTSConfig,
    seed: int,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
) -> Qwen3TTSTalker:
    """A talker with the reference's init scheme (N(0, 0.02) weights and embeddings, zero biases, unit norms),
    drawn on ``device`` from a generator seeded with ``seed`` (deterministic per device type)."""
    model = build_model(config, device, dtype)
    init_like_reference(model, seed, device, INIT_STD)
    return model


def talker_checkpoint_state(model: Qwen3TTSTalker) -> dict[str, torch.Tensor]:
    """The model's weights under their checkpoint names (``talker.*``), for writing ``model.safetensors``."""
    return {TALKER_PREFIX + k: v.detach().contiguous() for k, v in model.state_dict().items()}
