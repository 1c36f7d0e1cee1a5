"""A stage started by ``voxstage serve`` must not outlive its launcher, even one killed with SIGKILL.

The child arranges it itself, first thing in ``python -m voxstage``: the kernel's parent-death signal
(``PR_SET_PDEATHSIG``), armed when the launcher's pid is in ``VOXSTAGE_PARENT_PID``. Not in a ``preexec_fn``:
a Python callback between fork and exec forces a full ``fork()`` of the launcher (instead of ``vfork``),
running fork handlers in a process whose gRPC health probes have threads; CI saw that fork hang the
launcher for good, with its gateway never started.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import signal
import sys
from collections.abc import Mapping, MutableMapping
from typing import NoReturn

PARENT_ENV = "VOXSTAGE_PARENT_PID"
_PR_SET_PDEATHSIG = 1


def child_env(base: Mapping[str, str]) -> dict[str, str]:
    """The environment for a stage this process launches: it will stop when this process dies."""
    return {**base, PARENT_ENV: str(os.getpid())}


def die_with_launcher(env: MutableMapping[str, str] = os.environ) -> bool:
    """Arm SIGTERM on the launcher's death if ``env`` names a launcher; True if armed. The variable is
    removed, so what this process starts in turn is not tied to our launcher."""
    launcher = env.pop(PARENT_ENV, None)
    if not launcher:
        return False
    with contextlib.suppress(OSError, AttributeError):  # not Linux: nothing to arm
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM) != 0:
            return False
        # The launcher may have died before the signal was armed: then it will never come.
        if os.getppid() != int(launcher):
            os.kill(os.getpid(), signal.SIGTERM)
        return True
    return False


def exit_process(code: int) -> NoReturn:
    """End a ``voxstage`` process with ``code``. One that imported torch (a talker or codec) runs its exit
    handlers, flushes and leaves without the interpreter's teardown: freeing torch's modules one by one
    took 0.6-0.9 s of every stage's stop, paid again by each supervised restart and rolling update, and
    nothing in it is ours. Every other process exits as usual."""
    if "torch" not in sys.modules:
        sys.exit(code)
    atexit._run_exitfuncs()  # logging's flush, shared-memory finalizers: what a normal exit would run
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)
