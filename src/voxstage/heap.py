"""Keeping the cyclic garbage collector's full passes off the serving path.

A generation-2 collection walks every object the collector tracks, and holds the GIL while it does: the
engine thread and the event loop both stop. A stage holds about 180,000 such objects once torch, gRPC and
its model are loaded, and a full pass over them took about 100 ms on a 2-core CI box (a load client with
the ``openai`` package, 112,000 objects: 85 ms). One such pause during a duplex tick makes every session's
frame of that tick late at once. The start-up heap lives as long as the process, so it is frozen once the
process is warm (``gc.freeze``): later passes walk only what was allocated since, and garbage cycles are
still collected. ``voxstage_gc_pause_seconds{generation}`` records every pass, so a dashboard shows what
remains.
"""

from __future__ import annotations

import gc
import time
from typing import Any

from voxstage import metrics

_started: list[float] = []  # a pass in progress (the collector does not nest)
_frozen = False


def _on_gc(phase: str, info: dict[str, Any]) -> None:
    if phase == "start":
        _started.append(time.perf_counter())
    elif _started:
        metrics.GC_PAUSE.labels(generation=str(info["generation"])).observe(
            time.perf_counter() - _started.pop()
        )


def watch_gc_pauses() -> None:
    """Observe each collection's pause into ``voxstage_gc_pause_seconds`` (once per process)."""
    if _on_gc not in gc.callbacks:
        gc.callbacks.append(_on_gc)


def freeze() -> int:
    """Collect, then move every surviving object out of the collector's reach; returns the objects frozen
    in all. For a process about to start timed work (a load client before each level's clock)."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


def freeze_startup_heap() -> int:
    """``freeze`` on a server's first call only (a later one would also freeze what requests made since, in
    a process that starts servers more than once). Returns the objects frozen."""
    global _frozen
    if not _frozen:
        freeze()
        _frozen = True
    return gc.get_freeze_count()
