"""The gateway's background loops wait and stop through these two helpers, so a stop always ends them.

Python 3.11's ``asyncio.wait_for`` swallows a cancellation that arrives in the same loop iteration as the
awaited thing completing (CPython gh-86296): it returns the result instead of raising. A loop of the form
``while True: wait_for(event.wait(), t)`` then survives the ``cancel()`` of a stop whenever the event was
set just before (a probe finished, a channel left READY), and the stop that awaits it waits forever. The
teardown of a gateway test hung that way for a minute now and then: its bounded stop cancelled the hung
wait, and the ``suppress(CancelledError)`` around the await swallowed that cancellation too, so the stop
returned as if nothing had happened. ``wait_event`` waits without ``wait_for``; ``cancel_and_wait`` awaits
cancelled tasks without swallowing its own caller's cancellation.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable


async def wait_event(event: asyncio.Event, timeout_s: float | None) -> bool:
    """Wait until ``event`` is set or ``timeout_s`` has passed (None: no limit); True when it is set. A
    cancellation of the caller always propagates, whatever else happens in the same iteration."""
    if event.is_set():
        return True
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(timeout_s):
            await event.wait()
    return event.is_set()


async def cancel_and_wait(tasks: Iterable[asyncio.Task[object]]) -> None:
    """Cancel ``tasks`` and wait until each has ended; then raise the first error one of them ended with
    (a cancellation is how they are meant to end). A cancellation of the caller propagates (``asyncio.wait``
    does not turn it into a return), so a task that does not end shows as a stop that does not end, not as
    one that silently gave up waiting."""
    tasks = list(tasks)
    for task in tasks:
        task.cancel()
    if tasks:
        await asyncio.wait(tasks)
    errors = [t.exception() for t in tasks if not t.cancelled()]
    first = next((e for e in errors if e is not None), None)
    if first is not None:
        raise first
