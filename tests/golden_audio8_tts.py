"""Access to the Audio8-TTS golden fixtures in ``tests/fixtures/audio8_tts`` (made by
``tests/golden_builders/make_golden_audio8_tts.py`` with ``transformers`` 4.57.3 ``Qwen2Model`` /
``LlamaModel``).

The generator imports this file by path inside its throwaway venv, so it depends only on numpy and torch,
never on ``voxstage`` at import time.

Weights are not stored: every tensor is a pure function of its checkpoint key (the counter hash of
``tests/golden_personaplex.py`` gives int8 values, scaled by a per-tensor power of two), so every value is
exact in fp32 and bf16 and both sides compute the same tensors from this file. The fixture keeps the
config, the key/shape list, the inputs and the reference's outputs.
"""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import torch

CASES_JSON = "cases.json"
CASES_NPZ = "cases.npz"

# A tiny geometry of the released architecture (2 fast layers, so the fast stack is really a stack); every
# id, the vocabulary and the 10 x 4096 codebooks stay real.
GOLDEN_OVERRIDES: dict[str, Any] = {
    "dim": 64,
    "n_layer": 2,
    "n_head": 4,
    "n_local_heads": 2,
    "head_dim": 16,
    "intermediate_size": 176,
    "max_seq_len": 64,
    "n_fast_layer": 2,
    "fast_dim": 64,
    "fast_n_head": 4,
    "fast_n_local_heads": 2,
    "fast_head_dim": 16,
    "fast_intermediate_size": 176,
}
# The released values the tiny geometry keeps (models.md §2.2), written out so this file needs no voxstage.
RELEASED_IDS: dict[str, Any] = {
    "model_type": "arktts",
    "vocab_size": 155776,
    "rope_base": 1e6,
    "norm_eps": 1e-6,
    "attention_qkv_bias": True,
    "fast_attention_qkv_bias": False,
    "codebook_size": 4096,
    "num_codebooks": 10,
    "semantic_begin_id": 151678,
    "semantic_end_id": 155773,
    "eos_token_id": 151645,
    "pad_token_id": 151643,
    "norm_fastlayer_input": True,
}


def golden_config() -> dict[str, Any]:
    return {**RELEASED_IDS, **GOLDEN_OVERRIDES}


def fixture_dir() -> Path:
    return Path(__file__).resolve().parent / "fixtures" / "audio8_tts"


def _hashed_int8() -> Any:
    spec = importlib.util.spec_from_file_location(
        "golden_personaplex", Path(__file__).resolve().parent / "golden_personaplex.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.hashed_int8


def checkpoint_shapes(c: dict[str, Any]) -> dict[str, list[int]]:
    """The released flat key layout (models.md §2.3) for config ``c``."""
    d, fd = c["dim"], c["fast_dim"]
    shapes: dict[str, list[int]] = {
        "embeddings.weight": [c["vocab_size"], d],
        "codebook_embeddings.weight": [c["num_codebooks"] * c["codebook_size"], d],
        "norm.weight": [d],
        "fast_embeddings.weight": [c["codebook_size"], fd],
        "fast_norm.weight": [fd],
        "fast_output.weight": [c["codebook_size"], fd],
    }
    for prefix, n, width, heads, kv, hd, ffn, bias in (
        ("layers", c["n_layer"], d, c["n_head"], c["n_local_heads"], c["head_dim"], c["intermediate_size"],
         c["attention_qkv_bias"]),
        ("fast_layers", c["n_fast_layer"], fd, c["fast_n_head"], c["fast_n_local_heads"], c["fast_head_dim"],
         c["fast_intermediate_size"], c["fast_attention_qkv_bias"]),
    ):  # fmt: skip
        for i in range(n):
            p = f"{prefix}.{i}"
            shapes[f"{p}.attention.wqkv.weight"] = [(heads + 2 * kv) * hd, width]
            if bias:
                shapes[f"{p}.attention.wqkv.bias"] = [(heads + 2 * kv) * hd]
            shapes[f"{p}.attention.wo.weight"] = [width, heads * hd]
            shapes[f"{p}.feed_forward.w1.weight"] = [ffn, width]
            shapes[f"{p}.feed_forward.w3.weight"] = [ffn, width]
            shapes[f"{p}.feed_forward.w2.weight"] = [width, ffn]
            shapes[f"{p}.attention_norm.weight"] = [width]
            shapes[f"{p}.ffn_norm.weight"] = [width]
    return dict(sorted(shapes.items()))


def make_tensor(name: str, shape: tuple[int, ...]) -> torch.Tensor:
    """int8 hash values times a power of two: norms in [0.5, 1.5], biases about +-0.06, matrices and
    embeddings with std about 1/sqrt(fan-in) (embeddings twice that, so greedy choices are decisive)."""
    q = _hashed_int8()(name, shape, 7).astype(np.float32)
    if name.endswith("norm.weight"):
        return torch.from_numpy(1.0 + q * np.float32(2.0**-8))
    if name.endswith(".bias"):
        return torch.from_numpy(q * np.float32(2.0**-11))
    exp = int(round(math.log2(1.0 / (math.sqrt(shape[-1]) * 73.0))))
    if "embeddings" in name:
        exp += 1
    return torch.from_numpy(q * np.float32(2.0**exp))


def make_state_dict(shapes: dict[str, list[int]]) -> dict[str, torch.Tensor]:
    return {name: make_tensor(name, tuple(shape)) for name, shape in shapes.items()}


def load_fixture(root: Path | None = None) -> dict[str, Any]:
    """``cases.json`` plus its arrays (``case["arrays"]`` name -> ndarray)."""
    root = root or fixture_dir()
    doc = json.loads((root / CASES_JSON).read_text())
    with np.load(root / CASES_NPZ, allow_pickle=False) as data:
        doc["arrays"] = {k: data[k].copy() for k in data.files}
    return doc


def fixture_model(doc: dict[str, Any], rope_dtype: torch.dtype, dtype: torch.dtype = torch.float32) -> Any:
    """voxstage's model with the fixture's weights (imports voxstage lazily: the generator never calls it)."""
    from services.talker.models.audio8_tts.config import parse_config
    from services.talker.models.audio8_tts.loader import build_model, load_weights

    model = build_model(parse_config(doc["config"], source="fixture"), "cpu", dtype, rope_dtype=rope_dtype)
    load_weights(model, make_state_dict(doc["shapes"]), source="fixture")
    return model
