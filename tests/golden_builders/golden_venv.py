"""Throwaway venvs that hold a reference implementation for the golden-fixture scripts.

The reference packages (``qwen-tts``, ``moshi``, ``transformers``) are never voxstage dependencies: each
fixture script makes (or reuses) its own venv, installs the pinned requirements plus the reference
``--no-deps``, and re-runs itself there (``run_in_venv``).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import venv
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# Single-threaded, fixed hashing: reruns give byte-identical fixtures.
DETERMINISTIC_ENV = {"PYTHONHASHSEED": "0", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


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


def command_line(script: Path, out: Path) -> str:
    """The command that regenerates fixtures in ``out`` (recorded in them), relative to the repo."""
    shown = out.relative_to(REPO) if out.is_relative_to(REPO) else out
    return f"python tests/golden_builders/{script.name} --out {shown}"


def run_in_venv(
    argv: list[str] | None,
    *,
    script: str,
    doc: str,
    default_venv: Path,
    default_out: Path,
    requirements: Sequence[str],
    no_deps: Sequence[str],
    inner: Callable[[Path, str], None],
    env: Mapping[str, str] | None = None,
) -> int:
    """A fixture script's ``main``: parse ``--venv/--out/--inner``; outside the venv, make (or reuse) it and
    re-run ``script`` (the caller's ``__file__``) there with ``--inner`` and ``env`` added to the
    deterministic environment; inside, ``inner(out, command_line)`` writes the fixtures."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--venv", type=Path, default=default_venv, help="throwaway venv for the reference")
    parser.add_argument("--out", type=Path, default=default_out, help="fixture directory to (re)write")
    parser.add_argument("--inner", action="store_true", help="internal: run inside the reference venv")
    args = parser.parse_args(argv)
    out = args.out.resolve()
    path = Path(script).resolve()
    if args.inner:
        inner(out, command_line(path, out))
        return 0
    python = ensure_venv(args.venv.resolve(), requirements, no_deps)
    cmd = [str(python), str(path), "--inner", "--out", str(out)]
    full_env = {**os.environ, **(env or {}), **DETERMINISTIC_ENV}
    return subprocess.run(cmd, env=full_env, cwd=str(REPO)).returncode
