"""A stage's slice of the GPU's SMs under CUDA MPS (the deploy file's ``mps_active_thread_percentage``).

Why: the talker and the codec are two processes on one GPU. Without MPS their contexts take turns on the
whole device (time slices), so a talker frame step waits behind a codec tick. Plain MPS lets their kernels
run at once, but either may fill every SM (no better than time slices on the H200, issue 14). A per-process
active-thread percentage caps the SMs a process's kernels may occupy, so each stage gets a literal slice
(measured in docs/benchmarks.md: better under load, slower for a lone stream; off by default).

The CUDA driver reads ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` when the process creates its context, so it is
set before torch touches CUDA. Without a running MPS control daemon the variable does nothing, and a key
that silently does nothing is a defect: the stage refuses to start instead, naming the key and the pipe
directory it looked in.
"""

from __future__ import annotations

import os
import sys
from collections.abc import MutableMapping
from pathlib import Path

THREAD_PERCENTAGE_ENV = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
PIPE_DIR_ENV = "CUDA_MPS_PIPE_DIRECTORY"
DEFAULT_PIPE_DIR = "/tmp/nvidia-mps"  # where driver and daemon meet unless the variable says otherwise


class MpsUnavailableError(RuntimeError):
    """``mps_active_thread_percentage`` is set but no MPS control daemon can be reached."""


def pipe_dir(env: MutableMapping[str, str]) -> Path:
    return Path(env.get(PIPE_DIR_ENV) or DEFAULT_PIPE_DIR)


def apply_thread_percentage(
    percentage: int | None, env: MutableMapping[str, str] | None = None
) -> str | None:
    """Give this process ``percentage`` % of the GPU's threads under MPS (None: leave it alone); return a
    line for the start-up log. Must run before CUDA is initialised in this process."""
    if percentage is None:
        return None
    env = os.environ if env is None else env
    control = pipe_dir(env) / "control"
    if not control.exists():
        raise MpsUnavailableError(
            f"mps_active_thread_percentage is {percentage}, but no MPS control daemon answers at {control}: "
            f"start one (nvidia-cuda-mps-control -d) with the same {PIPE_DIR_ENV} as this stage, "
            "or remove the key"
        )
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        raise RuntimeError("mps_active_thread_percentage must be applied before CUDA is initialised")
    env[THREAD_PERCENTAGE_ENV] = str(percentage)
    return f"MPS client at {control.parent}, {percentage} % of the GPU's threads"
