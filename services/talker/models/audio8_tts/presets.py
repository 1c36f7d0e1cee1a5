"""Talker-side presets of Audio8-TTS, as flat ``config.json`` dicts in the released layout.

* ``audio8-tts-tiny``: the real architecture at toy width (dim 64, 2 slow layers, 1 fast layer, GQA 4/2
  heads of 16) for CPU tests and the demo; the vocabulary (155776), the semantic id range, the 10 x 4096
  codebooks, the special ids, ``max_seq_len`` 2048, RAS and the ``codec_*`` fields stay real (the codec
  stage reads those from the same file). Seeded random weights on disk, a tiny real BPE tokenizer whose
  special tokens sit at the released ids.
* ``audio8-tts-0.6b``: the released config (models.md §2.2), for GPU benchmarks: random weights drawn on
  the device at load (``loader.random_init``), never written.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from .config import GENERATION_CONFIG_FILE, Audio8TalkerConfig, GenerationConfig, parse_config
from .loader import random_init, save_checkpoint
from .tokenizer import write_tiny_tokenizer

TINY_OVERRIDES: dict[str, Any] = {
    "dim": 64,
    "n_layer": 2,
    "n_head": 4,
    "n_local_heads": 2,
    "head_dim": 16,
    "intermediate_size": 176,
    "n_fast_layer": 1,
    "fast_dim": 64,
    "fast_n_head": 4,
    "fast_n_local_heads": 2,
    "fast_head_dim": 16,
    "fast_intermediate_size": 176,
}
PRESETS: dict[str, dict[str, Any]] = {"audio8-tts-tiny": TINY_OVERRIDES, "audio8-tts-0.6b": {}}
TINY_PRESETS = ("audio8-tts-tiny",)


def preset_config(name: str) -> dict[str, Any]:
    """The flat ``config.json`` of preset ``name`` (every field written out, ``model_type`` included)."""
    if name not in PRESETS:
        raise ValueError(f"unknown Audio8-TTS preset {name!r}; expected one of {sorted(PRESETS)}")
    return {**Audio8TalkerConfig().to_dict(), **PRESETS[name]}


def preset_generation_config() -> dict[str, Any]:
    """The released ``generation_config.json`` values."""
    g = GenerationConfig()
    return {"do_sample": g.do_sample, "temperature": g.temperature, "top_k": g.top_k, "top_p": g.top_p}


def write_preset(name: str, out_dir: Path | str, seed: int = 0) -> bool:
    """Materialize preset ``name`` as a checkpoint directory (config, generation config, tokenizer; weights
    for the tiny preset only). Returns whether the weights are to be drawn at load (``random_init``)."""
    out = Path(out_dir)
    raw = preset_config(name)
    config = parse_config(raw, source=name)
    out.mkdir(parents=True, exist_ok=True)
    write_tiny_tokenizer(out)  # the tiny BPE stands in at every size: token counts, not identities, set cost
    if name in TINY_PRESETS:
        with torch.no_grad():
            model = random_init(config, seed=seed)
        save_checkpoint(out, model, raw, generation=preset_generation_config(), dtype=torch.float32)
        return False
    (out / "config.json").write_text(json.dumps(raw, indent=2) + "\n")
    (out / GENERATION_CONFIG_FILE).write_text(json.dumps(preset_generation_config(), indent=2) + "\n")
    return True
