"""Access to the Mimi golden fixtures in ``tests/fixtures/personaplex/mimi`` (made by
``tests/golden_builders/golden_personaplex_mimi.py`` with the reference ``moshi`` 0.2.13; see the README
there).

Depends on numpy, torch and safetensors only. Weights are stored as int8 ``q`` with a per-tensor ``exp``
(value ``q * 2**exp``), so :func:`load_state_dict` returns fp32 tensors bit-identical to what moshi ran.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import save_file


def fixture_dir() -> Path:
    return Path(__file__).resolve().parent / "fixtures" / "personaplex" / "mimi"


def _read_json(path: Path) -> dict[str, Any]:
    data = json.loads(path.read_text())
    if not isinstance(data, dict):
        raise ValueError(f"{path} must hold a JSON object")
    return data


def load_meta(root: Path | None = None) -> dict[str, Any]:
    """``cases.json``: versions, seed, tolerances, array shapes."""
    return _read_json((root or fixture_dir()) / "cases.json")


def load_config(root: Path | None = None) -> dict[str, Any]:
    """The tiny config in moshi's nested ``_mimi_config`` shape."""
    return _read_json((root or fixture_dir()) / "mimi_config.json")


@lru_cache(maxsize=4)
def _load_npz(path: str) -> dict[str, np.ndarray]:
    with np.load(path, allow_pickle=False) as data:
        return {k: data[k] for k in data.files}


def load_arrays(root: Path | None = None) -> dict[str, np.ndarray]:
    """Every array of ``cases.npz`` (a fresh copy each call, so tests may modify them)."""
    return {k: v.copy() for k, v in _load_npz(str((root or fixture_dir()) / "cases.npz")).items()}


def load_state_dict(root: Path | None = None) -> dict[str, torch.Tensor]:
    """fp32 weights under the kyutai checkpoint keys, exactly as moshi ran with them."""
    root = root or fixture_dir()
    manifest = _read_json(root / "weights.json")
    stored = _load_npz(str(root / "weights.npz"))
    out: dict[str, torch.Tensor] = {}
    for key, info in manifest.items():
        value = stored[key].astype(np.float32) * np.float32(2.0 ** int(info["exp"]))
        if list(value.shape) != list(info["shape"]):
            raise ValueError(f"{key}: stored shape {value.shape} != manifest {info['shape']}")
        out[key] = torch.from_numpy(value)
    return out


def decode_codes(root: Path | None = None) -> torch.Tensor:
    """The decode cases' codes as ``[1, 8, frames]`` int64."""
    return torch.from_numpy(load_arrays(root)["decode_codes"].astype(np.int64))[None]


def encode_pcm(root: Path | None = None) -> torch.Tensor:
    """The encode cases' PCM as ``[1, samples]`` float32 (``pcm16 / 32768``, exact)."""
    pcm16 = load_arrays(root)["encode_pcm16"]
    return torch.from_numpy(pcm16.astype(np.float32) / np.float32(32768.0))[None]


def materialize_checkpoint(out_dir: Path, root: Path | None = None) -> Path:
    """Write ``tokenizer-tiny.safetensors`` (fp32, kyutai layout) and ``mimi_config.json`` into ``out_dir``
    and return ``out_dir``; the fixture keeps only the compact int8 form."""
    root = root or fixture_dir()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    name = load_meta(root)["checkpoint_name"]
    state = {k: v.contiguous() for k, v in load_state_dict(root).items()}
    save_file(state, str(out_dir / name))
    (out_dir / "mimi_config.json").write_text(json.dumps(load_config(root), indent=2) + "\n")
    return out_dir
