#!/usr/bin/env python3
"""Build the PersonaPlex golden fixtures (LM and Mimi) from the reference ``moshi`` 0.2.13.

    python tests/golden_builders/make_golden_personaplex.py [--venv DIR] [--out tests/fixtures/personaplex]

Creates (or reuses) a throwaway venv holding ``moshi`` 0.2.13 (installed ``--no-deps``: it pins torch<2.10
but runs on the CPU torch 2.13), then re-runs itself there with ``--inner``: ``golden_personaplex_lm.py``
writes ``lm/`` and ``golden_personaplex_mimi.py`` writes ``mimi/``. ``NO_TORCH_COMPILE=1`` keeps moshi from
compiling its small kernels (20 s of first-step cost on CPU, same numbers). The reference is never a
voxstage dependency. Reruns give byte-identical files.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import golden_venv  # noqa: E402  (a sibling script, importable once the folder is on the path)

REPO = Path(__file__).resolve().parents[2]
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
    return golden_venv.run_in_venv(
        argv,
        script=__file__,
        doc=__doc__ or "",
        default_venv=DEFAULT_VENV,
        default_out=DEFAULT_OUT,
        requirements=REQUIREMENTS,
        no_deps=[REFERENCE],
        inner=_build,
        env={"NO_TORCH_COMPILE": "1"},
    )


def _build(out: Path, command: str) -> None:
    """Inside the venv: the LM fixtures into ``out/lm``, the Mimi ones into ``out/mimi``."""
    import torch
    from golden_personaplex_lm import build_lm_fixtures
    from golden_personaplex_mimi import build_mimi_fixtures

    torch.manual_seed(0)
    build_lm_fixtures(out / "lm", command=command)
    build_mimi_fixtures(out / "mimi")


if __name__ == "__main__":
    sys.exit(main())
