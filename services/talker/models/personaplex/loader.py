"""Loading the PersonaPlex LM from a released checkpoint directory, and random initialisation.

Layout (``nvidia/personaplex-7b-v1``): ``config.json`` (empty as released: the 7B architecture),
``model.safetensors`` (the LM in moshi's fused key layout), ``tokenizer_spm_32k_3.model`` (text),
``voices.tgz`` or ``voices/`` (stored voices) and ``tokenizer-*.safetensors`` (Mimi: the codec stage's).
File names follow moshi's ``config.json`` keys (``moshi_name``, ``tokenizer_name``) when present.

Weights load strictly: a missing, unexpected or mis-shaped key fails naming it. A checkpoint whose
depformer has 16 step sets (``dep_q: 16``, the reference loader's expanded form, which also "predicts" the
teacher-forced user stream) loads its first 8: the agent's tokens never depend on the others.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from voxstage.checkpoint import (
    CheckpointError,
    build_module,
    load_state_dict_strict,
    read_json,
    read_safetensors,
)

from .config import MOSHI_NAME, TOKENIZER_NAME, LMConfig, parse_lm_config
from .model import PersonaPlexLM
from .prompt import VoiceEmbeddings
from .tokenizer import PersonaTokenizer
from .voices import FOLDER, VoiceLibrary, write_voice


def read_config(checkpoint_dir: Path) -> LMConfig:
    path = Path(checkpoint_dir) / "config.json"
    raw = read_json(path) if path.is_file() else {}  # an absent or empty config means the released 7B
    return parse_lm_config(raw, source=str(path))


def tokenizer_path(checkpoint_dir: Path, config: LMConfig) -> Path:
    return Path(checkpoint_dir) / config.files.get("tokenizer_name", TOKENIZER_NAME)


def build_model(config: LMConfig, device: torch.device | str, dtype: torch.dtype) -> PersonaPlexLM:
    return build_module(lambda: PersonaPlexLM(config), device, dtype)


def select_agent_steps(state: dict[str, torch.Tensor], config: LMConfig) -> dict[str, torch.Tensor]:
    """Keep the depformer step sets of the agent's codebooks (all of a ``dep_q: 8`` checkpoint)."""
    if config.dep_q == config.steps:
        return state
    s, d = config.steps, config.depformer_dim
    numbered = re.compile(r"^(depformer_in|linears|depformer_emb|depformer\.layers\.\d+\.gating)\.(\d+)\.")
    limits = {"depformer_in": s, "linears": s, "depformer_emb": s - 1}
    out: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        m = numbered.match(key)
        if m and int(m.group(2)) >= limits.get(m.group(1), s):
            continue
        if key.endswith("self_attn.in_proj_weight") and key.startswith("depformer."):
            value = value[: s * 3 * d]
        elif key.endswith("self_attn.out_proj.weight") and key.startswith("depformer."):
            value = value[: s * d]
        out[key] = value
    return out


def load_personaplex_lm(
    checkpoint_dir: Path, *, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32
) -> tuple[PersonaPlexLM, PersonaTokenizer, VoiceLibrary]:
    checkpoint_dir = Path(checkpoint_dir)
    config = read_config(checkpoint_dir)
    weights = checkpoint_dir / config.files.get("moshi_name", MOSHI_NAME)
    # Build without memory and take the checkpoint's tensors: the 7B model never exists twice.
    model = build_model(config, "meta", dtype)
    state = select_agent_steps(read_safetensors(weights, device=device), config)
    load_state_dict_strict(model, state, source=str(weights), assign=True)
    tokenizer = PersonaTokenizer.from_file(tokenizer_path(checkpoint_dir, config))
    if tokenizer.vocab_size > config.text_card:
        raise CheckpointError(
            f"{tokenizer_path(checkpoint_dir, config)} has {tokenizer.vocab_size} pieces but the LM's text "
            f"vocabulary is {config.text_card}"
        )
    return model.eval(), tokenizer, VoiceLibrary.from_checkpoint(checkpoint_dir)


@torch.no_grad()
def random_init(
    config: LMConfig, *, seed: int, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32
) -> PersonaPlexLM:
    """Seeded random weights drawn on ``device`` (size-true presets never touch the disk): truncated normal
    with std 1/sqrt(fan-in), norms at 1. The same seed gives the same model on the same device type."""
    model = build_model(config, device, dtype)
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    for name, param in model.named_parameters():
        if name.endswith(".alpha"):
            param.fill_(1.0)
            continue
        fan_in = param.shape[-1]
        buf = torch.empty(param.shape, device=device, dtype=torch.float32)
        buf.normal_(0.0, 1.0 / math.sqrt(fan_in), generator=gen).clamp_(
            -3 / math.sqrt(fan_in), 3 / math.sqrt(fan_in)
        )
        param.copy_(buf)
    return model


def checkpoint_state(model: PersonaPlexLM) -> dict[str, torch.Tensor]:
    """The model's weights under their checkpoint names (``model.safetensors``)."""
    return {k: v.detach().contiguous() for k, v in model.state_dict().items()}


def save_checkpoint(
    out_dir: Path,
    model: PersonaPlexLM,
    lm_kwargs: dict[str, Any],
    *,
    tokenizer_model: bytes,
    voices: dict[str, VoiceEmbeddings],
    dtype: torch.dtype = torch.bfloat16,
) -> None:
    """Write the LM half of a checkpoint directory in the released layout: ``config.json`` (moshi kwargs;
    ``{}`` for the 7B), ``model.safetensors`` (``dtype``, bf16 as released), the tokenizer and ``voices/``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    config_path = out_dir / "config.json"
    existing = read_json(config_path) if config_path.is_file() else {}
    config_path.write_text(json.dumps({**existing, **lm_kwargs}, indent=2) + "\n")
    tensors = {k: v.to(dtype) for k, v in checkpoint_state(model).items()}
    save_file(tensors, str(out_dir / MOSHI_NAME), metadata={"format": "pt"})
    (out_dir / TOKENIZER_NAME).write_bytes(tokenizer_model)
    for name, voice in voices.items():
        write_voice(out_dir / FOLDER / f"{name}.pt", voice.embeddings, voice.cache)
