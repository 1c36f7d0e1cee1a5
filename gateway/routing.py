"""Stage replicas from static address lists: least-loaded choice, evidence-based health, fast re-probes.

A request picks the replica with the fewest streams this gateway holds on it (ties broken by the stage's
own last reported ``active_streams + queue_depth``, then round-robin). When every replica of a stage is
down, requests fail at once with UNAVAILABLE instead of waiting on a dead address.

A replica is marked down only on evidence that it is unreachable or not serving: a failed ``Status`` probe,
``ready: false``, or UNAVAILABLE from the transport (connect refused, connection reset). A per-stream error
(INTERNAL, UNKNOWN, RESOURCE_EXHAUSTED, a stream that ends without a terminal...) fails only that stream: it
is not evidence that the replica is down (under CPU load one such error used to take the only codec out of
rotation and fail most of the requests behind it), so it only triggers an immediate probe (``suspect``).

Health is watched, not only polled. Each replica's channel connectivity is followed: a stage that exits
drops its connection and the channel leaves READY at once, which triggers a probe then, instead of at the
next interval. A down replica is re-probed every ``DOWN_PROBE_S`` (not on a growing back-off), and the
channels' own reconnect back-off is capped at 0.25 s (gRPC's default grows to 120 s and hid a restarted
stage for 17-31 s), so a stage that comes back is routable again within about a second.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import grpc

from voxstage.gateway.errors import GatewayError
from voxstage.internal.v1 import stage_pb2, stage_pb2_grpc
from voxstage.server import CHANNEL_OPTIONS

log = logging.getLogger(__name__)

DOWN_PROBE_S = 0.2  # how often a down replica is re-probed: a restarted stage is seen within ~1 s
STATUS_TIMEOUT_S = 2.0
WATCH_POLL_S = 0.05  # how often the channels' connectivity is read (a stage's exit is seen this fast)
# gRPC's reconnect back-off starts at 1 s and grows to 120 s: after a long outage the channel would fail
# every probe fast until its next connect attempt, whatever our own schedule. Keep it short, as the codec's
# talker channels do (services/codec/upstream.py).
REPLICA_CHANNEL_OPTIONS: list[tuple[str, Any]] = [
    *CHANNEL_OPTIONS,
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 1000),  # the connect-attempt timeout, not a back-off
    ("grpc.max_reconnect_backoff_ms", 250),
]
_READY = grpc.ChannelConnectivity.READY


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
    retry_at: float = 0.0  # when a down replica is probed next
    down_at: float = 0.0  # when the latest evidence against it came
    failures: int = 0  # consecutive failed probes / transport failures (diagnostic)
    probed_at: float = 0.0
    probe_now: bool = False  # a per-stream error or a connectivity change asks for a probe at once
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
            Replica(stage, addr, grpc.aio.insecure_channel(addr, options=REPLICA_CHANNEL_OPTIONS), _order=i)
            for i, addr in enumerate(addresses)
        ]
        self._rr = itertools.count()
        self._wake = asyncio.Event()  # wakes the probe loop: a replica needs a probe sooner than planned
        self._listeners: list[Callable[[], None]] = []

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
        """A replica is routable and said it is ready: what readiness (/health, gRPC health) reports."""
        return self.ready_status() is not None

    def ready_status(self) -> stage_pb2.StageStatus | None:
        """The status of some ready replica (replicas of one stage serve the same model)."""
        for r in self.replicas:
            if not r.down and r.status is not None and r.status.ready:
                return r.status
        return None

    # -- health -----------------------------------------------------------------------------------------

    def on_change(self, listener: Callable[[], None]) -> None:
        """Call ``listener`` whenever a replica goes down or comes back (the gateway's readiness follows)."""
        self._listeners.append(listener)

    def _changed(self) -> None:
        self._wake.set()
        for listener in self._listeners:
            listener()

    def mark_down(self, replica: Replica, reason: str) -> None:
        """Take ``replica`` out of rotation: only on evidence that it is unreachable or not serving."""
        replica.failures += 1
        replica.down_at = time.monotonic()
        replica.retry_at = replica.down_at + DOWN_PROBE_S
        was_down, replica.down, replica.down_reason = replica.down, True, reason
        if not was_down:
            log.warning(
                "%s %s marked down: %s (re-probed every %.2f s)",
                self.stage,
                replica.address,
                reason,
                DOWN_PROBE_S,
            )
            self._changed()

    def suspect(self, replica: Replica, reason: str) -> None:
        """One stream on ``replica`` failed in a way that says nothing about the replica (INTERNAL, ...):
        keep routing to it, but probe it now so a replica that really died is marked down at once."""
        log.info("%s %s: a stream failed (%s); probing it", self.stage, replica.address, reason)
        replica.probe_now = True
        self._wake.set()

    def _mark_up(self, replica: Replica, status: stage_pb2.StageStatus) -> None:
        replica.status = status
        replica.failures = 0
        if replica.down:
            log.info("%s %s is back", self.stage, replica.address)
            replica.down = False
            replica.down_reason = ""
            self._changed()

    async def probe(self, replica: Replica) -> None:
        replica.probe_now = False
        started = replica.probed_at = time.monotonic()
        try:
            status = await self._status_fn(replica)
        except grpc.aio.AioRpcError as exc:
            self.mark_down(replica, f"Status failed: {exc.code().name}: {exc.details()}")
            return
        if replica.down and replica.down_at > started:
            return  # answered before a stream saw the transport fail: stale, the next probe decides
        if not status.ready:
            replica.status = status
            self.mark_down(replica, "not ready (warming up or draining)")
            return
        self._mark_up(replica, status)

    async def probe_all(self, *, force: bool = False) -> None:
        now = time.monotonic()
        due = [r for r in self.replicas if force or not r.down or r.retry_at <= now]
        await asyncio.gather(*(self.probe(r) for r in due))

    def _next_probe(self, replica: Replica, interval_s: float) -> float:
        if replica.probe_now:
            return 0.0
        return replica.retry_at if replica.down else replica.probed_at + interval_s

    async def run(self, interval_s: float) -> None:
        """Probe forever: live replicas every ``interval_s``, down ones every ``DOWN_PROBE_S``, and any
        replica at once when a stream on it failed or its channel left READY. Each probe runs on its own,
        so a replica that hangs for the whole ``STATUS_TIMEOUT_S`` does not hold the others' probes back."""
        watcher = asyncio.create_task(self._watch_channels())
        probing: dict[int, asyncio.Task[None]] = {}  # replica index -> its probe in flight
        try:
            while True:
                self._wake.clear()
                now = time.monotonic()
                for i, replica in enumerate(self.replicas):
                    if i not in probing and self._next_probe(replica, interval_s) <= now:
                        probing[i] = asyncio.create_task(self.probe(replica))
                        probing[i].add_done_callback(functools.partial(self._probe_done, probing, i))
                waits = [
                    self._next_probe(r, interval_s) - now
                    for i, r in enumerate(self.replicas)
                    if i not in probing
                ]
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(
                        self._wake.wait(), timeout=max(min(waits, default=interval_s), 0.01)
                    )
        finally:
            watcher.cancel()
            for task in probing.values():
                task.cancel()
            await asyncio.gather(watcher, *probing.values(), return_exceptions=True)

    def _probe_done(
        self, probing: dict[int, asyncio.Task[None]], index: int, task: asyncio.Task[None]
    ) -> None:
        probing.pop(index, None)
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.error("%s %s: probe raised %r", self.stage, self.replicas[index].address, exc)
        self._wake.set()  # schedule this replica's next probe

    async def _watch_channels(self) -> None:
        """The health watch: a stage that exits or restarts drops its connection, and its channel leaves
        READY the moment it does, long before the next periodic probe. Probe right then; the probe's
        outcome (not the state change, which a GOAWAY or an idle timeout also causes) decides.

        The state is polled (``get_state`` is a cheap local read) rather than awaited with
        ``wait_for_state_change``: cancelling that wait leaves its watch pending inside gRPC, which then
        completes into an event loop that may be gone."""
        states = [r.channel.get_state() for r in self.replicas]
        while True:
            await asyncio.sleep(WATCH_POLL_S)
            for i, replica in enumerate(self.replicas):
                new = replica.channel.get_state()
                if states[i] is _READY and new is not _READY:
                    replica.probe_now = True
                    self._wake.set()
                states[i] = new

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
