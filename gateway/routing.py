"""Stage replicas from static address lists: least-loaded choice, failure marking, background re-probes.

A request picks the replica with the fewest streams this gateway holds on it (ties broken by the stage's
own last reported ``active_streams + queue_depth``, then round-robin). A replica that fails a call at the
transport level, or answers ``Status`` with ``ready: false``, is marked down: no request goes there until
a later ``Status`` probe (after an exponential back-off) finds it ready again. When every replica of a stage
is down, requests fail at once with UNAVAILABLE instead of waiting on a dead address.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

import grpc

from voxstage.gateway.errors import GatewayError
from voxstage.internal.v1 import stage_pb2, stage_pb2_grpc
from voxstage.server import CHANNEL_OPTIONS

log = logging.getLogger(__name__)

FIRST_BACKOFF_S = 0.5
MAX_BACKOFF_S = 15.0
STATUS_TIMEOUT_S = 2.0


@dataclass
class Replica:
    stage: str
    address: str
    channel: grpc.aio.Channel
    in_flight: int = 0
    # None until the first Status answer: an unprobed replica is tried rather than refused.
    status: stage_pb2.StageStatus | None = None
    down: bool = False
    down_reason: str = ""
    retry_at: float = 0.0
    failures: int = 0
    _order: int = field(default=0, repr=False)

    @property
    def codec_stub(self) -> stage_pb2_grpc.CodecStub:
        return stage_pb2_grpc.CodecStub(self.channel)

    @property
    def talker_stub(self) -> stage_pb2_grpc.TalkerStub:
        return stage_pb2_grpc.TalkerStub(self.channel)

    @property
    def reported_load(self) -> int:
        return 0 if self.status is None else self.status.active_streams + self.status.queue_depth


StatusFn = Callable[[Replica], Awaitable[stage_pb2.StageStatus]]
T = TypeVar("T")


def parse_addresses(spec: str, *, flag: str) -> list[str]:
    """``host:port[,host:port...]`` -> list; a malformed entry is a usage error naming the flag."""
    out: list[str] = []
    for raw in spec.split(","):
        addr = raw.strip()
        host, sep, port = addr.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"{flag}: {raw!r} is not host:port")
        out.append(addr)
    if len(set(out)) != len(out):
        raise ValueError(f"{flag}: duplicate address in {spec!r}")
    return out


async def codec_status(replica: Replica) -> stage_pb2.StageStatus:
    reply = await replica.codec_stub.Status(stage_pb2.CodecStatusRequest(), timeout=STATUS_TIMEOUT_S)
    return reply.status


async def talker_status(replica: Replica) -> stage_pb2.StageStatus:
    reply = await replica.talker_stub.Status(stage_pb2.TalkerStatusRequest(), timeout=STATUS_TIMEOUT_S)
    return reply.status


class ReplicaPool:
    def __init__(self, stage: str, addresses: Sequence[str], status_fn: StatusFn) -> None:
        if not addresses:
            raise ValueError(f"{stage}: at least one replica address is needed")
        self.stage = stage
        self._status_fn = status_fn
        self.replicas = [
            Replica(stage, addr, grpc.aio.insecure_channel(addr, options=CHANNEL_OPTIONS), _order=i)
            for i, addr in enumerate(addresses)
        ]
        self._rr = itertools.count()
        self._changed = asyncio.Event()

    # -- choice -----------------------------------------------------------------------------------------

    def candidates(self) -> list[Replica]:
        return [r for r in self.replicas if not r.down]

    def pick(self, exclude: Sequence[Replica] = ()) -> Replica:
        live = [r for r in self.candidates() if r not in exclude]
        if not live:
            raise self.unavailable()
        turn = next(self._rr)
        n = len(self.replicas)
        return min(live, key=lambda r: (r.in_flight, r.reported_load, (r._order - turn) % n))

    def unavailable(self) -> GatewayError:
        why = "; ".join(f"{r.address}: {r.down_reason or 'down'}" for r in self.replicas)
        return GatewayError(
            grpc.StatusCode.UNAVAILABLE,
            f"no {self.stage} replica is available ({why})",
            field=self.stage,
            retry_after_s=self.next_retry_in(),
            reason=f"{self.stage}_unavailable",
        )

    def next_retry_in(self) -> float:
        now = time.monotonic()
        waits = [max(r.retry_at - now, 0.0) for r in self.replicas if r.down]
        return min(waits, default=0.0) + 0.1

    @property
    def any_ready(self) -> bool:
        return any(not r.down and r.status is not None and r.status.ready for r in self.replicas)

    def ready_status(self) -> stage_pb2.StageStatus | None:
        """The status of some ready replica (replicas of one stage serve the same model)."""
        for r in self.replicas:
            if not r.down and r.status is not None and r.status.ready:
                return r.status
        return None

    # -- health -----------------------------------------------------------------------------------------

    def mark_down(self, replica: Replica, reason: str) -> None:
        replica.failures += 1
        backoff = min(FIRST_BACKOFF_S * 2 ** (replica.failures - 1), MAX_BACKOFF_S)
        replica.retry_at = time.monotonic() + backoff
        if not replica.down:
            log.warning(
                "%s %s marked down: %s (re-probe in %.1f s)", self.stage, replica.address, reason, backoff
            )
        replica.down = True
        replica.down_reason = reason
        self._changed.set()

    def _mark_up(self, replica: Replica, status: stage_pb2.StageStatus) -> None:
        if replica.down:
            log.info("%s %s is back", self.stage, replica.address)
        replica.status = status
        replica.down = False
        replica.down_reason = ""
        replica.failures = 0
        self._changed.set()

    async def probe(self, replica: Replica) -> None:
        try:
            status = await self._status_fn(replica)
        except grpc.aio.AioRpcError as exc:
            self.mark_down(replica, f"Status failed: {exc.code().name}: {exc.details()}")
            return
        if not status.ready:
            replica.status = status
            self.mark_down(replica, "not ready (warming up or draining)")
            return
        self._mark_up(replica, status)

    async def probe_all(self, *, force: bool = False) -> None:
        now = time.monotonic()
        due = [r for r in self.replicas if force or not r.down or r.retry_at <= now]
        await asyncio.gather(*(self.probe(r) for r in due))

    async def run(self, interval_s: float) -> None:
        """Re-probe forever: live replicas every ``interval_s``, down ones when their back-off ends."""
        while True:
            await self.probe_all()
            self._changed.clear()
            wake = min(
                [interval_s, *(max(r.retry_at - time.monotonic(), 0.05) for r in self.replicas if r.down)]
            )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), timeout=wake)

    async def close(self) -> None:
        await asyncio.gather(*(r.channel.close() for r in self.replicas))


async def open_on_pair(
    codecs: ReplicaPool, talkers: ReplicaPool, attempt: Callable[[Replica, Replica], Awaitable[T]]
) -> tuple[Replica, Replica, T]:
    """Run ``attempt`` (open a stream) on the least-loaded codec and talker; a replica that fails with
    UNAVAILABLE before the codec's ``opened`` is marked down and the next one is tried, so one dead replica
    costs a request nothing while others live. On success both replicas' ``in_flight`` stay counted until
    the caller gives them back; ``attempt`` cleans up its own stream when it raises."""
    tried_codecs: list[Replica] = []
    tried_talkers: list[Replica] = []
    last: GatewayError | None = None
    while True:
        try:
            codec = codecs.pick(exclude=tried_codecs)
            talker = talkers.pick(exclude=tried_talkers)
        except GatewayError:
            if last is not None:
                raise last from None
            raise
        if codec.status is None:
            await codecs.probe(codec)
            if codec.down:
                tried_codecs.append(codec)
                continue
        codec.in_flight += 1
        talker.in_flight += 1
        try:
            return codec, talker, await attempt(codec, talker)
        except BaseException as exc:
            codec.in_flight -= 1
            talker.in_flight -= 1
            if not isinstance(exc, GatewayError) or exc.code is not grpc.StatusCode.UNAVAILABLE:
                raise
            last = exc
            if exc.reason == "codec_unavailable":
                tried_codecs.append(codec)
            elif exc.reason.startswith("talker"):
                talkers.mark_down(talker, exc.text)
                tried_talkers.append(talker)
            else:
                raise
