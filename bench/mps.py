"""A CUDA MPS control daemon of the benchmark's own, for ``bench/run_gpu.py --mps`` (issue 14's GPU-sharing
lever: plain MPS, and MPS with each stage's ``mps_active_thread_percentage``).

The daemon gets private pipe and log directories, exported to every process the run starts (the stages
find it through ``CUDA_MPS_PIPE_DIRECTORY``), and is told to quit when the run ends, even when a phase
failed, so the next run on the machine starts from a GPU without MPS.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

CONTROL = "nvidia-cuda-mps-control"


@contextmanager
def mps_daemon(
    root: Path, *, start_timeout_s: float = 10.0, quit_timeout_s: float = 30.0
) -> Iterator[dict[str, str]]:
    """Run an MPS control daemon whose pipe and log directories are under ``root``; yields their env."""
    control = shutil.which(CONTROL)
    if control is None:
        raise RuntimeError(f"--mps: {CONTROL} is not on PATH (it ships with the CUDA driver)")
    env = {"CUDA_MPS_PIPE_DIRECTORY": str(root / "pipe"), "CUDA_MPS_LOG_DIRECTORY": str(root / "log")}
    for folder in env.values():
        Path(folder).mkdir(parents=True, exist_ok=True)
    saved = {key: os.environ.get(key) for key in env}
    os.environ.update(env)
    try:
        subprocess.run([control, "-d"], check=True, timeout=30)
        deadline = time.monotonic() + start_timeout_s
        while not (root / "pipe" / "control").exists():
            if time.monotonic() > deadline:
                raise RuntimeError(f"--mps: the daemon made no control pipe in {root / 'pipe'}")
            time.sleep(0.05)
        yield env
    finally:
        if (root / "pipe" / "control").exists():
            # quit waits for the daemon's clients to go; one still alive here must not turn a finished run
            # into a failed one (its results are already written), so a slow quit is reported, not raised.
            try:
                subprocess.run([control], input="quit\n", text=True, timeout=quit_timeout_s, check=False)
            except subprocess.TimeoutExpired:
                late = f"did not quit within {quit_timeout_s:g} s (a client still open?)"
                print(f"--mps: the daemon in {root} {late}", flush=True)
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
