"""A tiny random-init Qwen3-TTS talker (the ``qwen3-tts-tiny`` preset) shared by the engine tests."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from services.talker.models.qwen3_tts.config import parse_config
from services.talker.models.qwen3_tts.loader import random_init
from services.talker.models.qwen3_tts.model import Qwen3TTSTalker
from services.talker.models.qwen3_tts.presets import preset_config, preset_generation_config
from services.talker.models.qwen3_tts.tokenizer import QwenTextTokenizer, write_tiny_tokenizer

# Tiny models are dominated by per-op overhead: one intra-op thread avoids oversubscribing small CI machines.
torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tiny_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> QwenTextTokenizer:
    d: Path = tmp_path_factory.mktemp("tiny_tok")
    write_tiny_tokenizer(d)
    return QwenTextTokenizer.from_dir(d)


def _tiny(variant: str) -> Qwen3TTSTalker:
    cfg = parse_config(preset_config("qwen3-tts-tiny", variant), preset_generation_config(), source="preset")
    return random_init(cfg, seed=0, dtype=torch.float32)


@pytest.fixture(scope="session")
def tiny_custom_voice() -> Qwen3TTSTalker:
    return _tiny("custom_voice")


@pytest.fixture(scope="session")
def tiny_base() -> Qwen3TTSTalker:
    return _tiny("base")


# ---- Qwen3-TTS model-family tests (test_qwen3_tts_talker_*.py) ---------------------------------------


@torch.no_grad()
def sharpen(model: Qwen3TTSTalker, seed: int) -> Qwen3TTSTalker:
    """Random init at 0.02 gives near-uniform logits; scale heads and embeddings up so greedy choices are
    decisive and the tests see structure (repeated codes, EOS) rather than near-ties."""
    gen = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        if "embedding" in name:
            p.copy_(torch.randn(p.shape, generator=gen))
        elif name.endswith("bias"):
            p.copy_(0.1 * torch.randn(p.shape, generator=gen))
        elif not name.endswith("norm.weight"):
            p.copy_(torch.randn(p.shape, generator=gen) / p.shape[-1] ** 0.5)
    return model


@pytest.fixture(scope="session")
def tiny_model() -> Callable[[str], Qwen3TTSTalker]:
    """``tiny_model(variant)``: a sharpened tiny talker per variant, built once per session."""
    cache: dict[str, Qwen3TTSTalker] = {}

    def get(variant: str) -> Qwen3TTSTalker:
        if variant not in cache:
            cache[variant] = sharpen(_tiny(variant), seed=1)
        return cache[variant]

    return get
