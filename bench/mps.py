"""A CUDA MPS control daemon of the benchmark's own, for ``bench/run_gpu.py --mps`` (plain MPS: every stage an
MPS client without a share). It is the daemon ``voxstage serve`` runs itself when a stage sets
``mps_active_thread_percentage`` (``voxstage.stage.mps.mps_daemon``): private pipe and log directories,
exported to every process the run starts, and ``quit`` when the run ends, even when a phase failed, so the
next run on the machine starts from a GPU without MPS. Under it, ``voxstage serve`` finds the daemon
answering and starts none of its own.
"""

from __future__ import annotations

from voxstage.stage.mps import CONTROL, mps_daemon

__all__ = ["CONTROL", "mps_daemon"]
