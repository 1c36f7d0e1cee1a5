"""Throwaway venvs that hold a reference implementation for the golden-fixture scripts.

The reference packages (``qwen-tts``, ``moshi``) are never voxstage dependencies: each fixture script makes
(or reuses) its own venv, installs the pinned requirements plus the reference ``--no-deps``, and re-runs
itself there.
"""

from __future__ import annotations

import hashlib
import subprocess
import venv
from collections.abc import Sequence
from pathlib import Path


def venv_python(venv_dir: Path) -> Path:
    return venv_dir / "bin" / "python"


def ensure_venv(venv_dir: Path, requirements: Sequence[str], no_deps: Sequence[str]) -> Path:
    """Create the venv if needed; reinstall only when the requirement lists changed. ``no_deps`` are
    installed without their dependencies (the reference packages pin old versions they run fine without)."""
    python = venv_python(venv_dir)
    stamp = venv_dir / ".voxstage-golden-requirements"
    wanted = hashlib.sha256("\n".join([*requirements, "--no-deps", *no_deps]).encode()).hexdigest()
    if python.exists() and stamp.exists() and stamp.read_text().strip() == wanted:
        return python
    if not python.exists():
        print(f"creating venv {venv_dir}", flush=True)
        venv.EnvBuilder(with_pip=True, clear=False).create(venv_dir)
    pip = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    subprocess.run([*pip, *requirements], check=True)
    if no_deps:
        subprocess.run([*pip, "--no-deps", *no_deps], check=True)
    stamp.write_text(wanted + "\n")
    return python
