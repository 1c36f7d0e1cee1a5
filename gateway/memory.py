"""Giving memory back after large messages (issue 26: refused requests left the gateway at 440-900 MB).

A request message of several megabytes arrives in gRPC's receive buffers and is parsed into Python objects;
once it is refused, all of that is free, but glibc keeps freed memory in its per-thread arenas and, after a
large block is freed, raises its threshold for serving blocks by ``mmap`` (which return to the system at
once). RSS then stays at the high-water mark of the last burst. Two measures, glibc only (elsewhere they do
nothing): a fixed ``mmap`` threshold and trim threshold of 128 KiB (``tune_allocator``, once at start), and
a ``malloc_trim`` soon after a large message was seen (``Trimmer``). Measured with the gateway against stage
doubles, three bursts of 8 concurrent refused 10 MB requests: 40-60 MB above the 87 MB baseline without
them, 1 MB with them. (The request itself must not outlive its RPC either: ``app._forget_frames``; that
left hundreds of MB.) tests/integration/test_chaos.py measures it on the real stack on every run.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import logging

from gateway.tasks import cancel_and_wait

log = logging.getLogger(__name__)

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
THRESHOLD_BYTES = 128 * 1024
LARGE_MESSAGE_BYTES = 1024 * 1024  # a message this size or more makes the next trim worth its few ms
TRIM_INTERVAL_S = 1.0


def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        libc = ctypes.CDLL(name)
    except OSError:
        return None
    return libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None


_LIBC = _libc()


def tune_allocator() -> bool:
    """Fixed glibc thresholds, so large blocks are mapped and unmapped instead of staying in an arena."""
    if _LIBC is None:
        return False
    ok = _LIBC.mallopt(M_MMAP_THRESHOLD, THRESHOLD_BYTES) and _LIBC.mallopt(M_TRIM_THRESHOLD, THRESHOLD_BYTES)
    return bool(ok)


class Trimmer:
    """``seen(size)`` from anywhere (the request parsers); a task on the event loop trims at most once a
    ``TRIM_INTERVAL_S`` after a large message."""

    def __init__(self) -> None:
        self.pending = False
        self.trims = 0
        self._task: asyncio.Task[None] | None = None
        self._users = 0  # gateways of this process that started it (tests run several)

    def seen(self, size: int) -> None:
        if size >= LARGE_MESSAGE_BYTES:
            self.pending = True  # a plain store: safe from any thread

    def start(self) -> None:
        self._users += 1
        if _LIBC is not None and self._task is None:
            self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        self._users = max(self._users - 1, 0)
        if self._task is not None and not self._users:
            task, self._task = self._task, None
            await cancel_and_wait([task])

    async def _run(self) -> None:
        assert _LIBC is not None
        while True:
            await asyncio.sleep(TRIM_INTERVAL_S)
            if self.pending:
                self.pending = False
                _LIBC.malloc_trim(0)
                self.trims += 1


TRIMMER = Trimmer()
