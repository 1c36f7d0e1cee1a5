"""Access to the PersonaPlex LM golden fixtures in ``tests/fixtures/personaplex/lm`` (made by
``tests/golden_builders/make_golden_personaplex.py`` from the reference ``moshi`` 0.2.13 package).

The generator imports this file by path inside its throwaway venv, so it depends only on numpy and torch,
never on ``voxstage`` at import time.

Weights are not stored: every tensor is a pure function of its name (a counter hash gives int8 values,
scaled by a per-tensor power of two), so the fixture holds only names, shapes and exponents and every value
is exact in fp32 and bf16. Both sides compute the same tensors from this file.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import torch

LM_DIR = "lm"
CASES_JSON = "cases.json"
CASES_NPZ = "cases.npz"

_M64 = np.uint64(0xFFFFFFFFFFFFFFFF)


def fixture_dir() -> Path:
    return Path(__file__).resolve().parent / "fixtures" / "personaplex"


def _splitmix(x: np.ndarray) -> np.ndarray:
    x = (x + np.uint64(0x9E3779B97F4A7C15)) & _M64
    x = ((x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)) & _M64
    x = ((x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)) & _M64
    return x ^ (x >> np.uint64(31))


def _name_key(name: str) -> np.uint64:
    h = np.uint64(1469598103934665603)
    for byte in name.encode():
        h = np.uint64((int(h) ^ byte) * 1099511628211 & 0xFFFFFFFFFFFFFFFF)
    return h


def hashed_int8(name: str, shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    """Deterministic int8 values in [-127, 127] for tensor ``name`` (platform and version independent)."""
    n = math.prod(shape)
    with np.errstate(over="ignore"):
        base = _splitmix(np.asarray([_name_key(name) ^ np.uint64(seed)], np.uint64))[0]
        bits = _splitmix(np.arange(n, dtype=np.uint64) ^ base)
    return ((bits % np.uint64(255)).astype(np.int64) - 127).astype(np.int8).reshape(shape)


def tensor_exponent(name: str, shape: tuple[int, ...]) -> int:
    """Scale 2**exp for the int8 values: std about 1/sqrt(fan-in), like the reference's init."""
    fan_in = shape[-1]
    return int(round(math.log2(1.0 / (math.sqrt(fan_in) * 73.0))))


def make_tensor(name: str, shape: tuple[int, ...], seed: int = 0) -> torch.Tensor:
    q = hashed_int8(name, shape, seed).astype(np.float32)
    if name.endswith(".alpha"):  # norm scales around 1, in [0.5, 1.5]
        return torch.from_numpy(1.0 + q * np.float32(2.0**-8))
    return torch.from_numpy(q * np.float32(2.0 ** tensor_exponent(name, shape)))


def make_state_dict(shapes: dict[str, list[int]], seed: int = 0) -> dict[str, torch.Tensor]:
    return {name: make_tensor(name, tuple(shape), seed) for name, shape in shapes.items()}


def load_meta(root: Path | None = None) -> dict[str, Any]:
    data = json.loads(((root or fixture_dir()) / LM_DIR / CASES_JSON).read_text())
    assert isinstance(data, dict)
    return data


def load_case(name: str, root: Path | None = None) -> dict[str, Any]:
    """One case: its metadata (``lm_kwargs``, ``shapes``, ``prompt``, ...) and its arrays (``inputs [T, 17]``:
    the effective input column of every step; ``made [T, 9]``: the text and agent tokens each step put in
    the next column, after forcing; ``user [T, 8]``: the user frame of every step)."""
    root = root or fixture_dir()
    meta = load_meta(root)
    case = dict(meta["cases"][name])
    with np.load(root / LM_DIR / CASES_NPZ, allow_pickle=False) as data:
        for field in case["arrays"]:
            case[field] = data[f"{name}.{field}"].copy()
    return case


def fixture_model(case: dict[str, Any], dtype: torch.dtype = torch.float32, device: str = "cpu") -> Any:
    """voxstage's LM with a case's weights (imports voxstage lazily: the generator never calls this)."""
    from services.talker.models.personaplex.config import parse_lm_config
    from services.talker.models.personaplex.loader import build_model
    from voxstage.checkpoint import load_state_dict_strict

    config = parse_lm_config(case["lm_kwargs"], source="fixture")
    model = build_model(config, device, dtype)
    load_state_dict_strict(model, make_state_dict(case["shapes"]), source="fixture")
    return model
