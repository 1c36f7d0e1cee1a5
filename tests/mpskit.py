"""A stand-in for ``nvidia-cuda-mps-control`` (no GPU in CI): a script that does to the file system what the
real one does (``-d`` makes the control pipe in ``CUDA_MPS_PIPE_DIRECTORY``; ``quit`` on stdin removes it)
and logs every call, for the tests of ``voxstage.stage.mps`` and of the launchers that run it. The GPU runs
(``bench/run_gpu.py``, ``voxstage serve`` with a share) use the real one."""

from __future__ import annotations

import stat
from pathlib import Path

FAKE = """#!/bin/sh
# -d: start (make the control pipe); no argument: read a command from stdin ("quit": remove it).
echo "$@" >> "{calls}"
if [ "$1" = "-d" ]; then touch "$CUDA_MPS_PIPE_DIRECTORY/control"; exit 0; fi
read command; echo "stdin $command" >> "{calls}"
[ "$command" = quit ] && rm -f "$CUDA_MPS_PIPE_DIRECTORY/control"
"""


def install_fake_control(bin_dir: Path, calls: Path) -> Path:
    """Write the stand-in into ``bin_dir`` (put it first on PATH); it appends its calls to ``calls``."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    script = bin_dir / "nvidia-cuda-mps-control"
    script.write_text(FAKE.format(calls=calls))
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return script
