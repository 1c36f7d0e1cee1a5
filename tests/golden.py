"""Access to the Qwen3-TTS golden fixtures in ``tests/fixtures/qwen3_tts`` (made by
``tests/golden_builders/make_golden_qwen3_tts.py`` from the reference ``qwen-tts`` 0.1.1 package).

Tests import this as ``from tests.golden import ...`` (run pytest as ``python -m pytest`` from the repo root).
The generator also imports this file by path inside its throwaway venv, so it may only depend on numpy,
torch and safetensors, never on ``voxstage`` at import time.

Weights are stored as int8 values times a per-tensor power of two, so every value is exact in fp32 and in
bf16; :func:`load_state_dict` returns them as fp32 tensors, bit-identical to what the reference ran with.
"""

from __future__ import annotations

import json
import shutil
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import save_file

VARIANTS: tuple[str, ...] = ("custom_voice", "voice_design", "base")
PARTS: tuple[str, ...] = ("model", "speech_tokenizer")

# File names inside the fixture directory; the README documents each one.
CASES_JSON = "cases.json"
CASES_NPZ = "cases.npz"
WEIGHTS_JSON = "weights.json"
GENERATION_CONFIG = "generation_config.json"
SPEECH_TOKENIZER_CONFIG = "speech_tokenizer.config.json"
PREPROCESSOR_CONFIG = "speech_tokenizer.preprocessor_config.json"


def fixture_dir() -> Path:
    return Path(__file__).resolve().parent / "fixtures" / "qwen3_tts"


def model_config_name(variant: str) -> str:
    _check_variant(variant)
    return f"config.{variant}.json"


def _check_variant(variant: str) -> None:
    if variant not in VARIANTS:
        raise ValueError(f"unknown Qwen3-TTS variant {variant!r}; expected one of {VARIANTS}")


def _read_json(path: Path) -> dict[str, Any]:
    data = json.loads(path.read_text())
    if not isinstance(data, dict):
        raise ValueError(f"{path} must hold a JSON object")
    return data


def load_meta(root: Path | None = None) -> dict[str, Any]:
    """The whole ``cases.json``: versions, seeds, tolerances and per-case metadata."""
    return _read_json((root or fixture_dir()) / CASES_JSON)


def load_weights_manifest(root: Path | None = None) -> dict[str, Any]:
    return _read_json((root or fixture_dir()) / WEIGHTS_JSON)


def load_config(name: str, root: Path | None = None) -> dict[str, Any]:
    """``name`` is a variant (its ``config.json``), ``"generation"``, ``"speech_tokenizer"`` or
    ``"preprocessor"``."""
    files = {
        "generation": GENERATION_CONFIG,
        "speech_tokenizer": SPEECH_TOKENIZER_CONFIG,
        "preprocessor": PREPROCESSOR_CONFIG,
    }
    file = files.get(name) or model_config_name(name)
    return _read_json((root or fixture_dir()) / file)


@lru_cache(maxsize=4)
def _load_npz(path: str) -> dict[str, np.ndarray]:
    with np.load(path, allow_pickle=False) as data:
        return {k: data[k] for k in data.files}


def load_cases(root: Path | None = None) -> dict[str, dict[str, Any]]:
    """Every case as one dict: its JSON metadata (``kind``, ``variant``, ``args``, ...) plus one numpy
    array per name in its ``arrays`` list (stored in ``cases.npz`` as ``"<case>.<name>"``).

    Arrays keep their stored dtype (float32 for audio/logits/embeddings, int64 for ids and codes); wrap
    them with :func:`as_torch` where a tensor is needed.
    """
    root = root or fixture_dir()
    meta = load_meta(root)
    arrays = _load_npz(str(root / CASES_NPZ))
    cases: dict[str, dict[str, Any]] = {}
    for name, case_meta in meta["cases"].items():
        case = dict(case_meta)
        for field in case_meta.get("arrays", []):
            if field in case_meta:
                raise ValueError(f"case {name}: array {field!r} collides with a metadata key")
            case[field] = arrays[f"{name}.{field}"].copy()
        cases[name] = case
    return cases


def as_torch(array: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(array))


def _dequantize(q: np.ndarray, exp: int) -> np.ndarray:
    # q is int8 and exp a small integer: the product is exact in float32.
    return q.astype(np.float32) * np.float32(2.0**exp)


def load_state_dict(part: str, variant: str = "base", root: Path | None = None) -> dict[str, torch.Tensor]:
    """The fp32 weights of ``part`` (``"model"`` = ``model.safetensors``, ``"speech_tokenizer"`` =
    ``speech_tokenizer/model.safetensors``) exactly as the reference ran with them. For ``"model"`` the
    key set is the one of ``variant``: only ``"base"`` has ``speaker_encoder.*``."""
    if part not in PARTS:
        raise ValueError(f"unknown part {part!r}; expected one of {PARTS}")
    _check_variant(variant)
    root = root or fixture_dir()
    manifest = load_weights_manifest(root)
    entry = manifest[part]
    stored = _load_npz(str(root / entry["file"]))
    keys = entry["variants"][variant] if part == "model" else list(entry["tensors"])
    out: dict[str, torch.Tensor] = {}
    for key in keys:
        info = entry["tensors"][key]
        value = _dequantize(stored[key], int(info["exp"]))
        if list(value.shape) != list(info["shape"]):
            raise ValueError(f"{key}: stored shape {value.shape} != manifest {info['shape']}")
        out[key] = torch.from_numpy(value)
    return out


def _write_safetensors(state: dict[str, torch.Tensor], path: Path, dtype: torch.dtype) -> None:
    tensors = {k: v.to(dtype).contiguous() for k, v in state.items()}
    # HF checkpoints carry format=pt; some loaders check it.
    save_file(tensors, str(path), metadata={"format": "pt"})


def _write_json(data: dict[str, Any], path: Path) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=False) + "\n")


def materialize_checkpoint(
    variant: str,
    out_dir: Path,
    *,
    dtype: str = "float32",
    root: Path | None = None,
) -> Path:
    """Write the tiny checkpoint of ``variant`` to ``out_dir`` in the on-disk layout of a released
    Qwen3-TTS repo and return ``out_dir``:

    ``config.json``, ``generation_config.json``, ``model.safetensors``, ``speech_tokenizer/config.json``,
    ``speech_tokenizer/model.safetensors``, ``speech_tokenizer/preprocessor_config.json`` and, when
    ``services.talker.models.qwen3_tts.tokenizer.write_tiny_tokenizer`` is importable, the text tokenizer
    files (``vocab.json``, ``merges.txt``, ``tokenizer_config.json``).

    ``dtype`` applies to ``model.safetensors`` (released checkpoints use bfloat16 there; every stored value
    is exact in both). ``speech_tokenizer/model.safetensors`` is always float32, as released.
    """
    _check_variant(variant)
    torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}.get(dtype)
    if torch_dtype is None:
        raise ValueError(f"dtype must be 'float32' or 'bfloat16', not {dtype!r}")
    root = root or fixture_dir()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    st_dir = out_dir / "speech_tokenizer"
    st_dir.mkdir(exist_ok=True)

    config = load_config(variant, root)
    # transformers >= 4.56 writes "dtype"; older files say "torch_dtype". Keep whichever the config uses.
    config["torch_dtype" if "torch_dtype" in config else "dtype"] = dtype
    _write_json(config, out_dir / "config.json")
    shutil.copyfile(root / GENERATION_CONFIG, out_dir / "generation_config.json")
    _write_safetensors(load_state_dict("model", variant, root), out_dir / "model.safetensors", torch_dtype)

    shutil.copyfile(root / SPEECH_TOKENIZER_CONFIG, st_dir / "config.json")
    shutil.copyfile(root / PREPROCESSOR_CONFIG, st_dir / "preprocessor_config.json")
    _write_safetensors(
        load_state_dict("speech_tokenizer", variant, root), st_dir / "model.safetensors", torch.float32
    )

    try:
        from services.talker.models.qwen3_tts.tokenizer import write_tiny_tokenizer
    except ImportError:
        # The text tokenizer lives in voxstage (written by another part of the project); without it (e.g.
        # inside the generator's throwaway venv) the directory is complete except for the tokenizer files.
        return out_dir
    write_tiny_tokenizer(out_dir)
    return out_dir


def expected_checkpoint_files(with_tokenizer: bool) -> set[str]:
    """Relative paths :func:`materialize_checkpoint` writes."""
    files = {
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "speech_tokenizer/config.json",
        "speech_tokenizer/model.safetensors",
        "speech_tokenizer/preprocessor_config.json",
    }
    if with_tokenizer:
        files |= {"vocab.json", "merges.txt", "tokenizer_config.json"}
    return files
