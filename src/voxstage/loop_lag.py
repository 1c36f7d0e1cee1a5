"""How long a process's event loop was kept from running: ``voxstage_event_loop_lag_seconds``.

Every process serves its sessions' messages on one asyncio loop. Whatever keeps that loop from turning (a
callback that runs long, a garbage-collector pass, another thread holding the GIL through a burst of
launches) delays every session's next message at once, and a duplex frame late by more than its slack is
heard. A probe task sleeps ``INTERVAL_S`` at a time and records how much later than asked it woke: about
a millisecond on an idle loop (the timer's resolution), the length of the block when one fell in the sleep.
The cost is one wake-up every ``INTERVAL_S`` (50 a second).
"""

from __future__ import annotations

import asyncio
import weakref

from voxstage import metrics

INTERVAL_S = 0.02
_probes: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Task[None]] = (
    weakref.WeakKeyDictionary()
)


async def _probe(interval_s: float) -> None:
    loop = asyncio.get_running_loop()
    while True:
        asked = loop.time() + interval_s
        await asyncio.sleep(interval_s)
        metrics.EVENT_LOOP_LAG.observe(max(0.0, loop.time() - asked))


def watch_loop_lag(interval_s: float = INTERVAL_S) -> asyncio.Task[None]:
    """Start the running loop's probe (once per loop; a second call returns the first probe)."""
    loop = asyncio.get_running_loop()
    task = _probes.get(loop)
    if task is None or task.done():
        task = loop.create_task(_probe(interval_s), name="voxstage-loop-lag")
        _probes[loop] = task
    return task
