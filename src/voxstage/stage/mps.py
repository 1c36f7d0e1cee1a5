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

``voxstage serve`` runs the daemon itself (``serve_plan``, ``mps_daemon``) when a stage process with a share
runs on a GPU beside another stage process and no daemon answers already: private pipe and log directories,
exported to every process it starts, and ``quit`` when the launch ends, however it ends. ``bench/run_gpu.py
--mps`` (plain MPS, no shares) uses the same daemon.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator, MutableMapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

THREAD_PERCENTAGE_ENV = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
PIPE_DIR_ENV = "CUDA_MPS_PIPE_DIRECTORY"
LOG_DIR_ENV = "CUDA_MPS_LOG_DIRECTORY"
DEFAULT_PIPE_DIR = "/tmp/nvidia-mps"  # where driver and daemon meet unless the variable says otherwise
CONTROL = "nvidia-cuda-mps-control"  # ships with the CUDA driver


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


@dataclass(frozen=True)
class StageShare:
    """One stage process as ``voxstage serve`` places it: its name, the GPU it runs on (the first of its
    visible devices) and its ``mps_active_thread_percentage``."""

    name: str
    gpu: str
    percentage: int | None


def serve_plan(stages: Sequence[StageShare], device: str, env: MutableMapping[str, str]) -> str | None:
    """Whether ``voxstage serve`` must start an MPS daemon of its own: a line for its log when it must, None
    when no share is set, the stages run on the CPU, or a daemon answers already. Raises
    ``MpsUnavailableError`` naming the share that cannot work: no process with a share has another stage
    process on its GPU (a share caps a process only against others on one GPU; a lone replica's share is
    only warned about), or ``nvidia-cuda-mps-control`` is not on PATH."""
    shares = [s for s in stages if s.percentage is not None]
    if not shares or device == "cpu":
        return None  # on the CPU every stage warns that its share does nothing (voxstage.stage.process)
    lonely = [s for s in shares if not any(o is not s and o.gpu == s.gpu for o in stages)]
    if len(lonely) == len(shares):
        share = lonely[0]
        raise MpsUnavailableError(
            f"{share.name}: mps_active_thread_percentage is {share.percentage}, but no other stage "
            f"process runs on its GPU {share.gpu}: the share caps SMs only between processes on one GPU; "
            "remove the key or put the stages on one GPU"
        )
    for share in lonely:  # replicas placed apart: the share still matters on the shared GPUs
        log.warning(
            "%s: mps_active_thread_percentage %d caps nothing on GPU %s: no other stage process runs there",
            share.name, share.percentage, share.gpu,
        )  # fmt: skip
    control = pipe_dir(env) / "control"
    if control.exists():
        return None  # a daemon of the host's (or of bench/run_gpu.py --mps): the stages use it
    if shutil.which(CONTROL, path=env.get("PATH")) is None:
        names = ", ".join(f"{s.name} {s.percentage} %" for s in shares)
        raise MpsUnavailableError(
            f"mps_active_thread_percentage is set ({names}) and the stages share a GPU, but {CONTROL} is not "
            f"on PATH to start an MPS daemon (it ships with the CUDA driver) and none answers at {control}; "
            "install it, start a daemon, use --device cpu, or remove the key"
        )
    gpus = sorted({s.gpu for s in shares})
    return f"MPS: starting a private control daemon for the shares on GPU {', '.join(gpus)}"


@contextmanager
def mps_daemon(
    root: Path, *, start_timeout_s: float = 10.0, quit_timeout_s: float = 30.0
) -> Iterator[dict[str, str]]:
    """Run an MPS control daemon whose pipe and log directories are under ``root``; yields their variables,
    which are also set in ``os.environ`` for the block (so every process started meanwhile finds it). The
    daemon is told to quit when the block ends, also on an error; a quit that hangs is logged, not raised."""
    control = shutil.which(CONTROL)
    if control is None:
        raise MpsUnavailableError(f"{CONTROL} is not on PATH (it ships with the CUDA driver)")
    env = {PIPE_DIR_ENV: str(root / "pipe"), LOG_DIR_ENV: str(root / "log")}
    for folder in env.values():
        Path(folder).mkdir(parents=True, exist_ok=True)
    saved = {key: os.environ.get(key) for key in env}
    os.environ.update(env)
    try:
        subprocess.run([control, "-d"], check=True, timeout=30)
        deadline = time.monotonic() + start_timeout_s
        while not (root / "pipe" / "control").exists():
            if time.monotonic() > deadline:
                raise MpsUnavailableError(f"the MPS daemon made no control pipe in {root / 'pipe'}")
            time.sleep(0.05)
        yield env
    finally:
        if (root / "pipe" / "control").exists():
            # quit waits for the daemon's clients to go; one still alive here must not turn a finished run
            # into a failed one, so a slow quit is reported, not raised.
            try:
                subprocess.run([control], input="quit\n", text=True, timeout=quit_timeout_s, check=False)
            except subprocess.TimeoutExpired:
                log.warning(
                    "the MPS daemon in %s did not quit within %g s (a client still open?)",
                    root,
                    quit_timeout_s,
                )
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
