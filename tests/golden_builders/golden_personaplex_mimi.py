#!/usr/bin/env python3
"""Golden fixtures for the Mimi codec, recorded with the reference ``moshi`` 0.2.13 package.

    NO_TORCH_COMPILE=1 /tmp/moshi-venv/bin/python tests/golden_builders/golden_personaplex_mimi.py \
        --out tests/fixtures/personaplex/mimi

Runs inside a throwaway venv that has ``moshi`` (installed ``--no-deps``); it must not import voxstage, and
``tests/golden_builders/make_golden_personaplex.py`` calls :func:`build_mimi_fixtures` from there. It builds
the tiny Mimi of models.md §3.5 with ``moshi.models.loaders.get_mimi``, gives it seeded weights that are exact
in fp32 (every value ``q * 2**exp`` with ``q`` an int8), checks that a kyutai-format safetensors file of them
loads strictly into moshi, and records moshi's offline and frame-by-frame streaming encode and decode, once
with the released 250-step attention context and once with a 10-step context so the streaming ring wraps
within a few frames. Reruns write byte-identical files (fixed seeds, one thread, deterministic torch,
fixed zip timestamps).

The checkpoint itself (4.5 MB of fp32, almost all of it the 32 x 2048 codebooks) is not stored: the
fixture keeps the int8 grid values (``weights.npz`` + ``weights.json``) and the tests' helper
``tests/golden_personaplex_mimi.py`` writes ``tokenizer-tiny.safetensors`` + ``mimi_config.json`` on demand.
"""

from __future__ import annotations

import argparse
import copy
import importlib.machinery
import importlib.util
import io
import json
import math
import os
import sys
import tempfile
import types
import zipfile
import zlib
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

os.environ.setdefault("NO_TORCH_COMPILE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

SEED = 20250611
FRAMES = 40  # main case: 40 frames = 3.2 s, below the 125-frame point where moshi's ring first wraps
SHORT_CONTEXT = 10  # second case: a 10-step window wraps after 5 frames
SHORT_FRAMES = 24
NUM_CODEBOOKS = 8
CHECKPOINT_NAME = "tokenizer-tiny.safetensors"
TOLERANCES = {
    "pcm_abs": 1e-4,
    "latent_abs": 1e-4,
    "transformer_abs": 1e-4,
    "codes": "exact",
    "streaming_vs_offline_abs": 1e-5,
}
_TINY_OVERRIDES = {
    "seanet": {"dimension": 32, "n_filters": 4},
    "transformer": {
        "d_model": 32,
        "num_heads": 2,
        "num_layers": 2,
        "dim_feedforward": 64,
        "input_dimension": 32,
        "output_dimensions": [32],
    },
    "quantizer": {"dimension": 16, "input_dimension": 32, "output_dimension": 32},
}


def _stub_missing_hub() -> None:
    """``moshi.models.loaders`` imports huggingface_hub at module level; nothing here downloads, and a bare
    ``--no-deps`` venv may lack it, so an absent one is replaced by an inert stub."""
    if "huggingface_hub" in sys.modules or importlib.util.find_spec("huggingface_hub") is not None:
        return

    def _offline(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("huggingface_hub is stubbed: the golden builder never downloads")

    for name in ("huggingface_hub", "huggingface_hub.errors"):
        module = types.ModuleType(name)
        module.__spec__ = importlib.machinery.ModuleSpec(name, None)
        sys.modules[name] = module
    hub, errors = sys.modules["huggingface_hub"], sys.modules["huggingface_hub.errors"]
    setattr(hub, "hf_hub_download", _offline)  # noqa: B010 - a stub module has no typed attributes
    setattr(errors, "EntryNotFoundError", type("EntryNotFoundError", (Exception,), {}))  # noqa: B010


def tiny_mimi_config(loaders: Any, context: int | None = None) -> dict[str, Any]:
    """moshi's ``_mimi_config`` with the tiny overrides of models.md §3.5 (a fresh deep copy)."""
    cfg = copy.deepcopy(loaders._mimi_config)
    for part, changes in _TINY_OVERRIDES.items():
        cfg[part] = {**cfg[part], **copy.deepcopy(changes)}
    if context is not None:
        cfg["transformer"]["context"] = context
    return cfg


# -- grid weights ---------------------------------------------------------------------------------------
def _rng(key: str) -> np.random.Generator:
    # One stream per tensor, keyed by name: a tensor's values do not depend on which other keys exist.
    return np.random.default_rng([SEED, zlib.crc32(key.encode())])


def _normal_grid(key: str, shape: tuple[int, ...], std: float, levels: int = 8) -> tuple[np.ndarray, int]:
    exp = round(math.log2(std / levels))
    q = np.clip(np.rint(_rng(key).normal(0.0, std, size=shape) / 2.0**exp), -127, 127)
    return q.astype(np.int8), exp


def _uniform_grid(key: str, shape: tuple[int, ...], low: int, high: int, exp: int) -> tuple[np.ndarray, int]:
    return _rng(key).integers(low, high + 1, size=shape).astype(np.int8), exp


def _codebook_index(key: str) -> int:
    """Global codebook index of a ``quantizer.rvq_*.vq.layers.N._codebook.*`` key (semantic is 0)."""
    layer = int(key.split(".layers.")[1].split(".")[0])
    return layer if ".rvq_first." in key else layer + 1


def draw_tensor(key: str, shape: tuple[int, ...]) -> tuple[np.ndarray, int]:
    """Grid values for one checkpoint key, by role; every part of the model matters to the output."""
    name = key.rsplit(".", 1)[-1]
    if "._codebook." in key:
        if name == "_initialized":
            return np.ones(shape, dtype=np.int8), 0
        if _codebook_index(key) >= NUM_CODEBOOKS:
            # Never run (num_codebooks=8) but loaded strictly: constant, so they cost nothing to store.
            return (np.ones(shape, np.int8), 0) if name == "cluster_usage" else (np.zeros(shape, np.int8), 0)
        if name == "cluster_usage":
            # Powers of two in [0.5, 4]: the reference's sum / usage division is then exact.
            k = _rng(key).integers(-1, 3, size=shape)
            return (2 ** (k + 1)).astype(np.int8), -1
        return _uniform_grid(key, shape, -8, 8, -3)  # embedding_sum in [-1, 1]
    if name == "scale":  # LayerScale: 0.125 .. 1, far from the 0.01 init so the branches matter
        return _uniform_grid(key, shape, 8, 64, -6)
    if ".norm" in key and name == "weight":
        return _uniform_grid(key, shape, 24, 40, -5)  # 0.75 .. 1.25
    if name == "bias":
        return _normal_grid(key, shape, 0.05, levels=4)
    if key.endswith("convtr.weight"):  # ConvTranspose1d [in, out/groups, k]: fan-in ~ in * k / stride
        std = 1.0 / math.sqrt(shape[0] * shape[2] / 2)
    else:
        std = 1.0 / math.sqrt(math.prod(shape[1:]))
    if key.startswith("decoder.model.") and shape[0] == 1:
        std *= 0.5  # the last decoder conv: keep the waveform well inside [-1, 1]
    return _normal_grid(key, shape, std)


def moshi_key_to_checkpoint(key: str) -> str:
    """moshi's module names -> the kyutai checkpoint's (its load hook maps the fused projections back)."""
    return key.replace("self_attn.in_projs.0.weight", "self_attn.in_proj_weight").replace(
        "self_attn.out_projs.0.weight", "self_attn.out_proj.weight"
    )


def draw_checkpoint(model: torch.nn.Module) -> dict[str, tuple[np.ndarray, int]]:
    shapes = {moshi_key_to_checkpoint(k): tuple(v.shape) for k, v in model.state_dict().items()}
    return {key: draw_tensor(key, shape) for key, shape in shapes.items()}


def dequantize(grid: Mapping[str, tuple[np.ndarray, int]]) -> dict[str, torch.Tensor]:
    return {k: torch.from_numpy(q.astype(np.float32) * np.float32(2.0**exp)) for k, (q, exp) in grid.items()}


# -- deterministic files ----------------------------------------------------------------------------------
def write_npz(path: Path, arrays: Mapping[str, np.ndarray]) -> None:
    """Compressed .npz with sorted members and fixed timestamps (``np.savez_compressed`` stamps the time)."""
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=9) as zf:
        for name in sorted(arrays):
            buf = io.BytesIO()
            np.lib.format.write_array(buf, np.ascontiguousarray(arrays[name]), allow_pickle=False)
            info = zipfile.ZipInfo(name + ".npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            zf.writestr(info, buf.getvalue(), compresslevel=9)


def write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=2) + "\n")


# -- inputs ------------------------------------------------------------------------------------------------
def test_codes(frames: int, bins: int) -> np.ndarray:
    return (
        np.random.default_rng([SEED, 1]).integers(0, bins, size=(1, NUM_CODEBOOKS, frames)).astype(np.int64)
    )


def test_pcm16(samples: int, sample_rate: int) -> np.ndarray:
    """A 120 Hz -> 6 kHz log chirp under a slow tremolo plus white noise, peak 0.6, as int16."""
    t = np.arange(samples, dtype=np.float64) / sample_rate
    dur = samples / sample_rate
    f0, f1 = 120.0, 6000.0
    phase = 2 * np.pi * f0 * dur / math.log(f1 / f0) * (np.exp(t / dur * math.log(f1 / f0)) - 1)
    sig = np.sin(phase) * (0.6 + 0.4 * np.sin(2 * np.pi * 1.3 * t))
    sig += 0.1 * np.random.default_rng([SEED, 2]).standard_normal(samples)
    sig *= 0.6 / np.abs(sig).max()
    return np.rint(sig * 32767).astype(np.int16)


# -- reference runs -----------------------------------------------------------------------------------------
@contextmanager
def _capture(module: torch.nn.Module, sink: list[torch.Tensor]) -> Iterator[None]:
    def hook(_m: torch.nn.Module, _inp: Any, out: Any) -> None:
        sink.append((out[0] if isinstance(out, list | tuple) else out).detach().clone())

    handle = module.register_forward_hook(hook)
    try:
        yield
    finally:
        handle.remove()


def _stream(
    mimi: Any, fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, step: int
) -> torch.Tensor:
    with mimi.streaming(1):
        return torch.cat([fn(x[..., i : i + step]) for i in range(0, x.shape[-1], step)], dim=-1)


def record(
    mimi: Any, codes: torch.Tensor, pcm: torch.Tensor, prefix: str, full: bool
) -> dict[str, np.ndarray]:
    """Offline and frame-by-frame streaming runs of moshi on ``codes`` [1, 8, T] and ``pcm`` [1, 1, T*spf]."""
    spf = mimi.frame_size
    out: dict[str, np.ndarray] = {}
    tr_off: list[torch.Tensor] = []
    tr_st: list[torch.Tensor] = []
    with torch.no_grad():
        with _capture(mimi.decoder_transformer, tr_off):
            dec_off = mimi.decode(codes)
        with _capture(mimi.decoder_transformer, tr_st):
            dec_st = _stream(mimi, mimi.decode, codes, 1)
        lat_off = mimi._encode_to_unquantized_latent(pcm)
        codes_off = mimi.encode(pcm)
        lat_st = _stream(mimi, mimi._encode_to_unquantized_latent, pcm, spf)
        codes_st = _stream(mimi, mimi.encode, pcm, spf)
    # The streamed codes must be the quantized streamed latents: checks the recording itself.
    assert torch.equal(mimi.quantizer.encode(lat_st), codes_st)
    out[f"{prefix}.decoder_transformer_offline"] = tr_off[0][0].numpy()
    out[f"{prefix}.decoder_transformer_stream"] = torch.cat(tr_st, dim=-1)[0].numpy()
    out[f"{prefix}.encode_latent_offline"] = lat_off[0].numpy()
    out[f"{prefix}.encode_latent_stream"] = lat_st[0].numpy()
    out[f"{prefix}.encode_codes_offline"] = codes_off[0].numpy().astype(np.int16)
    out[f"{prefix}.encode_codes_stream"] = codes_st[0].numpy().astype(np.int16)
    if full:
        out[f"{prefix}.decode_pcm_offline"] = dec_off[0, 0].numpy()
        out[f"{prefix}.decode_pcm_stream"] = dec_st[0, 0].numpy()
    return out


def build_mimi_fixtures(out_dir: Path) -> None:
    """Write the Mimi golden fixtures into ``out_dir`` (created if needed)."""
    _stub_missing_hub()
    import moshi
    import safetensors
    from moshi.models import loaders
    from safetensors.torch import save_file

    torch.manual_seed(SEED)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)

    config = tiny_mimi_config(loaders)
    mimi = loaders.get_mimi(None, config, num_codebooks=NUM_CODEBOOKS).eval()
    grid = draw_checkpoint(mimi)
    weights = dequantize(grid)
    with tempfile.TemporaryDirectory() as tmp:
        # The kyutai layout must load strictly through moshi's own loader (its load hook, strict=True).
        path = Path(tmp) / CHECKPOINT_NAME
        save_file({k: v.contiguous() for k, v in weights.items()}, str(path))
        mimi = loaders.get_mimi(path, config, num_codebooks=NUM_CODEBOOKS).eval()
        short = loaders.get_mimi(path, tiny_mimi_config(loaders, SHORT_CONTEXT), num_codebooks=NUM_CODEBOOKS)
        short.eval()
    for key, value in mimi.state_dict().items():
        assert torch.equal(value, weights[moshi_key_to_checkpoint(key)]), key

    spf, bins = mimi.frame_size, mimi.cardinality
    codes_np = test_codes(FRAMES, bins)
    pcm16 = test_pcm16(FRAMES * spf, mimi.sample_rate)
    codes = torch.from_numpy(codes_np)
    pcm = torch.from_numpy(pcm16.astype(np.float32) / np.float32(32768.0))[None, None]
    arrays: dict[str, np.ndarray] = {"decode_codes": codes_np[0].astype(np.int16), "encode_pcm16": pcm16}
    arrays |= record(mimi, codes, pcm, "main", full=True)
    arrays |= record(short, codes[..., :SHORT_FRAMES], pcm[..., : SHORT_FRAMES * spf], "short", full=False)
    write_npz(out_dir / "cases.npz", arrays)
    write_npz(out_dir / "weights.npz", {k: q for k, (q, _) in grid.items()})
    write_json(
        out_dir / "weights.json", {k: {"shape": list(q.shape), "exp": exp} for k, (q, exp) in grid.items()}
    )
    write_json(out_dir / "mimi_config.json", config)
    write_json(out_dir / "full_size_keys.json", _full_size_keys(loaders))
    write_json(out_dir / "cases.json", _metadata(arrays, moshi.__version__, safetensors.__version__))
    (out_dir / "README.md").write_text(_README)


def _full_size_keys(loaders: Any) -> dict[str, list[int]]:
    """Checkpoint key -> shape of the released Mimi (built on the meta device: no weights needed)."""
    with torch.device("meta"):
        full = loaders.get_mimi(None, copy.deepcopy(loaders._mimi_config), device="meta")
    return {moshi_key_to_checkpoint(k): list(v.shape) for k, v in full.state_dict().items()}


def _metadata(arrays: Mapping[str, np.ndarray], moshi_version: str, st_version: str) -> dict[str, Any]:
    return {
        "reference": {
            "moshi": moshi_version,
            "torch": torch.__version__,
            "numpy": np.__version__,
            "safetensors": st_version,
            "settings": "CPU, fp32, 1 thread, deterministic algorithms, NO_TORCH_COMPILE=1",
        },
        "generator": "tests/golden_builders/golden_personaplex_mimi.py::build_mimi_fixtures",
        "command": "NO_TORCH_COMPILE=1 /tmp/moshi-venv/bin/python "
        "tests/golden_builders/golden_personaplex_mimi.py "
        "--out tests/fixtures/personaplex/mimi",
        "seed": SEED,
        "num_codebooks": NUM_CODEBOOKS,
        "checkpoint_name": CHECKPOINT_NAME,
        "cases": {
            "main": {"frames": FRAMES, "context": None, "pcm": "encode_pcm16 / 32768 (float32, exact)"},
            "short": {
                "frames": SHORT_FRAMES,
                "context": SHORT_CONTEXT,
                "inputs": "the first frames of main's",
            },
        },
        "tolerances": TOLERANCES,
        "arrays": {k: {"shape": list(v.shape), "dtype": str(v.dtype)} for k, v in sorted(arrays.items())},
    }


_README = """# Mimi golden fixtures

Recorded with the reference `moshi` 0.2.13 (versions in `cases.json["reference"]`) on the tiny Mimi of
models.md §3.5 (SEANet dimension 32 / 4 filters, transformer d_model 32 / 2 heads / 2 layers / ff 64,
quantizer dimension 16, 8 of 32 codebooks used, everything else as released). Made by
`tests/golden_builders/golden_personaplex_mimi.py` (see its docstring); reruns are byte-identical.

| file | holds |
|---|---|
| `mimi_config.json` | the tiny config, moshi's nested `_mimi_config` shape |
| `weights.npz`, `weights.json` | every checkpoint key (kyutai names): int8 `q`, value `q * 2**exp` |
| `cases.npz` | inputs and moshi's outputs (below) |
| `cases.json` | versions, seed, tolerances, array shapes |
| `full_size_keys.json` | checkpoint key -> shape of the released Mimi (moshi's module tree, kyutai names) |

`cases.npz`: `decode_codes` [8, 40] and `encode_pcm16` [40 * 1920] (the PCM is `pcm16 / 32768`) are the
inputs. For `main` (context 250) and `short` (the same weights with a 10-step context, first 24 frames):
`decoder_transformer_{offline,stream}` [32, 2T] (decoder transformer output), `encode_latent_{offline,stream}`
[32, T] (unquantized 12.5 Hz latents), `encode_codes_{offline,stream}` [8, T]; `main` also has
`decode_pcm_{offline,stream}` [T * 1920]. `offline` is moshi's non-streaming call on the whole input,
`stream` is `with mimi.streaming(1)` fed one 80 ms frame per call. In `short` the two differ once the
10-step ring wraps (frame 5): that is moshi's streaming semantics, which voxstage reproduces.

`tests/golden_personaplex_mimi.py` reads these files and writes the checkpoint directory
(`tokenizer-tiny.safetensors` + `mimi_config.json`) on demand.
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("tests/fixtures/personaplex/mimi"))
    args = parser.parse_args()
    build_mimi_fixtures(args.out)
    total = sum(p.stat().st_size for p in args.out.iterdir())
    print(f"wrote {args.out} ({total / 1e6:.2f} MB)")


if __name__ == "__main__":
    main()
