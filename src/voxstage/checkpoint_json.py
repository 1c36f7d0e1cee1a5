"""A checkpoint's JSON files and the error every loader raises, without torch: the launcher resolves a
model (a directory's family, a preset's marker) before any stage starts, and importing torch for that cost
it about 1.4 s of every start."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


class CheckpointError(ValueError):
    """A checkpoint directory or file does not match what the model expects."""


def read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise CheckpointError(f"missing file {path}")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{path} is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise CheckpointError(f"{path} must hold a JSON object")
    return data
