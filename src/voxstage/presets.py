"""Where a stage's model comes from: a real checkpoint directory or a built-in random-weight preset.

Presets are materialized as checkpoint directories in the **real on-disk layout**, so every stage loads
them through the same loader as a released checkpoint. Tiny presets carry seeded random weights on disk
(tens of MB); size-true presets (0.6B / 1.7B / 7B) carry only their config and tokenizer files and are
marked ``random_init`` so each stage draws its weights directly on its device (benchmarks: real FLOPs and
bytes, no multi-GB files). Which presets exist and how their files are written is each family's
(``voxstage.families``: the descriptor's presets and writers); this module only finds, builds and
publishes the directory. Building one is the only time a process imports both stages' model code.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from voxstage import families
from voxstage.checkpoint_json import CheckpointError, read_json

PRESET_MARKER = "voxstage_preset.json"
PRESET_SEED = 0


@dataclass(frozen=True)
class ModelSource:
    name: str  # what the user asked for (preset name or directory)
    path: Path
    family: str
    random_init: bool = False  # weights are drawn at load time (size-true presets)
    seed: int = PRESET_SEED


def cache_dir() -> Path:
    base = os.environ.get("VOXSTAGE_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "voxstage")
    return Path(base)


def resolve_model(spec: str, *, cache: Path | None = None) -> ModelSource:
    """Turn ``--model`` (a checkpoint directory or a preset name) into a loadable source."""
    path = Path(spec).expanduser()
    if path.is_dir():
        return ModelSource(spec, path, _family_of(path))
    found = families.preset(spec)
    if found is None:
        known = ", ".join(families.preset_names())
        raise CheckpointError(f"model: {spec!r} is neither a checkpoint directory nor a preset ({known})")
    family, preset = found
    out = (cache or cache_dir()) / "presets" / spec
    marker = out / PRESET_MARKER
    if not marker.is_file():
        _materialize(family, preset, out)
    info = read_json(marker)
    return ModelSource(spec, out, family.name, random_init=bool(info["random_init"]), seed=PRESET_SEED)


def _family_of(path: Path) -> str:
    config = path / "config.json"
    data = read_json(config) if config.is_file() else None
    try:
        return families.detect(path, data).name
    except families.UnknownFamily as exc:
        if data is None:
            read_json(config)  # no config.json and no layout a family claims: say the file is missing
        raise CheckpointError(str(exc)) from None


def _materialize(family: families.Family, preset: families.Preset, out: Path) -> None:
    """Run the family's writers (talker's files, then codec's) on a private directory, then publish it."""
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    tmp.mkdir(parents=True, exist_ok=True)
    for writer in family.preset_writers:
        families.load_ref(writer)(preset, tmp, PRESET_SEED)
    marker = {"preset": preset.name, "random_init": preset.random_init, "seed": PRESET_SEED}
    (tmp / PRESET_MARKER).write_text(json.dumps(marker, indent=2) + "\n")
    _publish(tmp, out)


def _publish(tmp: Path, out: Path) -> None:
    """Move a finished preset directory into place; a concurrent builder's identical copy may win."""
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        tmp.rename(out)
    except OSError:
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
        if not (out / PRESET_MARKER).is_file():
            raise
