"""Gateway admission: at most ``limit`` requests run at once; a bounded FIFO queue holds the next ones.

Each running request holds one talker slot and one codec stream, so the limit is the deploy file's
``gateway.max_concurrent_requests`` or, unset, the smaller of the two stages' ``max_num_seqs``
(``DeployConfig.admission_limit``). Admitting more would only queue work inside the stages, where a waiting
request still holds a stream and adds nothing but latency. Past the queue, or after ``queue_timeout_s`` in
it, a request is refused with RESOURCE_EXHAUSTED and a retry hint; the refusal costs no stage any work, so
admitted streams keep their pace under overload.
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import grpc

from gateway.errors import GatewayError
from voxstage import metrics

# Retry hints are clamped: below 100 ms a client would just spin, above 30 s it should rather fail over.
MIN_RETRY_S = 0.1
MAX_RETRY_S = 30.0


class Admission:
    def __init__(self, limit: int, *, max_queue: int, queue_timeout_s: float) -> None:
        if limit < 1:
            raise ValueError(f"admission limit must be >= 1, got {limit}")
        self.limit = limit
        self.max_queue = max_queue
        self.queue_timeout_s = queue_timeout_s
        self.active = 0
        self.draining = False
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        # Running mean of how long a request holds its slot, for the retry hint.
        self._mean_hold_s = 1.0
        metrics.ACTIVE_STREAMS.labels(stage="gateway").set(0)
        metrics.QUEUE_DEPTH.labels(stage="gateway").set(0)

    @property
    def queued(self) -> int:
        return sum(not w.done() for w in self._waiters)

    def retry_hint(self) -> float:
        """Seconds until a slot is likely free: the queue ahead drains ``limit`` requests per mean hold."""
        ahead = self.queued + 1
        return min(max(self._mean_hold_s * ahead / self.limit, MIN_RETRY_S), MAX_RETRY_S)

    def _refuse(self, why: str) -> GatewayError:
        return GatewayError(
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            why,
            field="admission",
            retry_after_s=self.retry_hint(),
            reason="overloaded",
        )

    async def acquire(self, timeout_s: float | None = None) -> None:
        """Take a slot, waiting in the queue for at most ``min(queue_timeout_s, timeout_s)`` seconds."""
        if self.draining:
            raise GatewayError(
                grpc.StatusCode.UNAVAILABLE,
                "the gateway is draining; retry on another instance",
                field="admission",
                reason="draining",
            )
        if self.active < self.limit and not self.queued:
            self.active += 1
            self._publish()
            return
        if self.queued >= self.max_queue:
            raise self._refuse(
                f"{self.active} requests running (limit {self.limit}) and {self.queued} queued "
                f"(gateway.max_queue {self.max_queue})"
            )
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        self._publish()
        wait_s = self.queue_timeout_s if timeout_s is None else min(self.queue_timeout_s, timeout_s)
        try:
            await asyncio.wait_for(asyncio.shield(waiter), timeout=max(wait_s, 0.0))
        except TimeoutError:
            if waiter.done() and not waiter.cancelled():
                return  # the slot arrived together with the timeout: keep it
            waiter.cancel()
            raise self._refuse(
                f"no slot became free within {wait_s:.1f} s in the queue (gateway.queue_timeout_s)"
            ) from None
        except asyncio.CancelledError:
            # The client left while queued. If a slot was handed over in the meantime, pass it on.
            if waiter.done() and not waiter.cancelled():
                self.release(held_s=None)
            else:
                waiter.cancel()
            raise
        finally:
            self._prune()
            self._publish()

    def release(self, held_s: float | None) -> None:
        if held_s is not None:
            self._mean_hold_s = 0.9 * self._mean_hold_s + 0.1 * held_s
        # Hand the slot straight to the oldest live waiter so the count never dips and lets a newcomer in.
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                self._publish()
                return
        self.active -= 1
        self._publish()

    @asynccontextmanager
    async def slot(self, timeout_s: float | None = None) -> AsyncIterator[None]:
        await self.acquire(timeout_s)
        start = time.monotonic()
        try:
            yield
        finally:
            self.release(time.monotonic() - start)

    def _prune(self) -> None:
        while self._waiters and self._waiters[0].done():
            self._waiters.popleft()

    def _publish(self) -> None:
        metrics.ACTIVE_STREAMS.labels(stage="gateway").set(self.active)
        metrics.QUEUE_DEPTH.labels(stage="gateway").set(self.queued)
