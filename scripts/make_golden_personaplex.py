#!/usr/bin/env python3
"""Build the PersonaPlex golden fixtures (LM and Mimi) from the reference ``moshi`` 0.2.13.

    python scripts/make_golden_personaplex.py [--venv DIR] [--out tests/fixtures/personaplex]

Creates (or reuses) a throwaway venv holding ``moshi`` 0.2.13 (installed ``--no-deps``: it pins torch<2.10
but runs on the CPU torch 2.13), then re-runs itself there with ``--inner``: ``golden_personaplex_lm.py``
writes ``lm/`` and ``golden_personaplex_mimi.py`` writes ``mimi/``. ``NO_TORCH_COMPILE=1`` keeps moshi from
compiling its small kernels (20 s of first-step cost on CPU, same numbers). The reference is never a
voxstage dependency. Reruns give byte-identical files.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import golden_venv  # noqa: E402  (a sibling script, importable once the folder is on the path)

REPO = Path(__file__).resolve().parents[1]
DEFAULT_VENV = Path("/tmp/voxstage-golden-moshi-venv")
DEFAULT_OUT = REPO / "tests" / "fixtures" / "personaplex"
# What moshi's LM and Mimi modules import (models.md §3.5, §4).
REQUIREMENTS = [
    "torch==2.13.0",
    "numpy==2.4.6",
    "safetensors==0.8.0",
    "einops==0.8.2",
    "sentencepiece==0.2.3",
    "huggingface_hub==0.36.2",
]
REFERENCE = "moshi==0.2.13"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--venv", type=Path, default=DEFAULT_VENV, help="throwaway venv for the reference")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="fixture directory to (re)write")
    parser.add_argument("--inner", action="store_true", help="internal: run inside the reference venv")
    args = parser.parse_args(argv)
    out = args.out.resolve()
    if args.inner:
        import torch
        from golden_personaplex_lm import build_lm_fixtures
        from golden_personaplex_mimi import build_mimi_fixtures

        torch.manual_seed(0)
        build_lm_fixtures(out / "lm", command=_command_line(out))
        build_mimi_fixtures(out / "mimi")
        return 0
    python = golden_venv.ensure_venv(args.venv.resolve(), REQUIREMENTS, [REFERENCE])
    env = {
        **os.environ,
        "NO_TORCH_COMPILE": "1",
        "PYTHONHASHSEED": "0",
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
    }
    cmd = [str(python), str(Path(__file__).resolve()), "--inner", "--out", str(out)]
    return subprocess.run(cmd, env=env, cwd=str(REPO)).returncode


def _command_line(out: Path) -> str:
    shown = out.relative_to(REPO) if out.is_relative_to(REPO) else out
    return f"python scripts/make_golden_personaplex.py --out {shown}"


if __name__ == "__main__":
    sys.exit(main())
