"""Stage replicas: least-loaded choice, evidence-based health, fast re-probes, membership that can change.

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

Membership may change while requests run (gateway/discovery.py keeps it equal to what the configured names
resolve to): a new replica is added and probed; one that left is *draining*: it takes no new work, the
streams already on it keep their channel until they end, and it is dropped when the last one has.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import grpc

from gateway.discovery import parse_addresses as parse_addresses  # where the CLI finds it
from gateway.errors import GatewayError
from gateway.tasks import wait_event
from voxstage.internal.v1 import stage_pb2, stage_pb2_grpc
from voxstage.link.client import LinkClient
from voxstage.link.wire import CODEC_REQUESTS, CODEC_RESPONSES
from voxstage.resolver import is_ip_literal, split_host_port
from voxstage.server import CHANNEL_OPTIONS
from voxstage.stage.tls import LinkTls, aio_channel
from voxstage.transport.shm_reader import ShmReader

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
    source: str = ""  # the configured address this replica came from (the name, for a discovered one)
    draining: bool = False  # gone from its name's resolution: no new work, in-flight streams finish
    _order: int = field(default=0, repr=False)

    # The link every request to this codec shares (docs/protocol.md §12); made on first use.
    link: LinkClient | None = field(default=None, repr=False)

    @property
    def codec_stub(self) -> stage_pb2_grpc.CodecStub:
        return stage_pb2_grpc.CodecStub(self.channel)

    def codec_link(self, reader: ShmReader | None) -> LinkClient | None:
        """The link to this codec, or None when its last Status did not offer one (an older codec, or not
        probed yet): its requests then take a call each."""
        if self.status is None or not self.status.link:
            return None
        if self.link is None:
            stub = self.codec_stub
            self.link = LinkClient(
                f"codec {self.address}", stub.Link, CODEC_REQUESTS, CODEC_RESPONSES, reader=reader
            )
        return self.link

    @property
    def talker_stub(self) -> stage_pb2_grpc.TalkerStub:
        return stage_pb2_grpc.TalkerStub(self.channel)

    @property
    def reported_load(self) -> int:
        return 0 if self.status is None else self.status.active_streams + self.status.queue_depth


StatusFn = Callable[[Replica], Awaitable[stage_pb2.StageStatus]]
T = TypeVar("T")


async def codec_status(replica: Replica) -> stage_pb2.StageStatus:
    reply = await replica.codec_stub.Status(stage_pb2.CodecStatusRequest(), timeout=STATUS_TIMEOUT_S)
    return reply.status


async def talker_status(replica: Replica) -> stage_pb2.StageStatus:
    reply = await replica.talker_stub.Status(stage_pb2.TalkerStatusRequest(), timeout=STATUS_TIMEOUT_S)
    return reply.status


class ReplicaPool:
    def __init__(
        self, stage: str, addresses: Sequence[str], status_fn: StatusFn, *, static_only: bool = False,
        tls: LinkTls | None = None,
    ) -> None:  # fmt: skip
        """``static_only``: take only the IP literals now; discovery adds what the names resolve to.
        ``tls``: mutual TLS on every replica's channel (``gateway.link_*``); None dials plain gRPC."""
        if not addresses:
            raise ValueError(f"{stage}: at least one replica address is needed")
        self.stage = stage
        self.tls = tls
        self._status_fn = status_fn
        self.replicas: list[Replica] = []
        self._rr = itertools.count()
        self._wake = asyncio.Event()  # wakes the probe loop: a replica needs a probe sooner than planned
        self._listeners: list[Callable[[], None]] = []
        # Called when routing meets a failure that fresh name resolution might fix (discovery.py).
        self.on_failure: Callable[[], None] = lambda: None
        self.resolve_errors: dict[str, str] = {}  # configured name -> why it does not resolve now
        for addr in addresses:
            if not static_only or is_ip_literal(split_host_port(addr)[0]):
                self.add(addr, source=addr, quiet=True)

    # -- membership -------------------------------------------------------------------------------------

    def find(self, address: str) -> Replica | None:
        return next((r for r in self.replicas if r.address == address), None)

    def add(self, address: str, *, source: str, quiet: bool = False) -> Replica:
        """A new replica, unprobed (tried rather than refused until its first Status); or a draining one
        that is back in its name's resolution."""
        replica = self.find(address)
        if replica is not None:
            if replica.draining:
                log.info("%s %s is back in %s: routable again", self.stage, address, source)
                replica.draining = False
                self._changed()
            return replica
        channel = aio_channel(address, REPLICA_CHANNEL_OPTIONS, self.tls)
        replica = Replica(self.stage, address, channel, source=source, _order=len(self.replicas))
        self.replicas.append(replica)
        if not quiet:
            replica.probe_now = True
            log.info("%s %s added (from %s)", self.stage, address, source)
            self._changed()
        return replica

    def drain(self, replica: Replica) -> None:
        """``replica`` left its name's resolution: route nothing new to it, let its streams finish."""
        if not replica.draining:
            replica.draining = True
            log.info(
                "%s %s is gone from %s: draining (%d stream(s) in flight finish there)",
                self.stage,
                replica.address,
                replica.source,
                replica.in_flight,
            )
            self._changed()
        self.reap_drained()

    def reap_drained(self) -> None:
        """Drop draining replicas that hold no stream any more (their channel is closed)."""
        gone = [r for r in self.replicas if r.draining and r.in_flight <= 0]
        if not gone:
            return
        self.replicas = [r for r in self.replicas if r not in gone]
        for i, replica in enumerate(self.replicas):
            replica._order = i
        for replica in gone:
            log.info("%s %s drained and removed", self.stage, replica.address)
            if replica.link is not None:
                replica.link.close()
            task = asyncio.ensure_future(replica.channel.close())
            task.add_done_callback(lambda t: t.cancelled() or t.exception())
        self._changed()

    # -- choice -----------------------------------------------------------------------------------------

    def candidates(self) -> list[Replica]:
        return [r for r in self.replicas if not r.down and not r.draining]

    def pick(self, exclude: Sequence[Replica] = ()) -> Replica:
        live = [r for r in self.candidates() if r not in exclude]
        if not live:
            self.on_failure()  # a name may have new endpoints by now
            raise self.unavailable()
        turn = next(self._rr)
        n = max(len(self.replicas), 1)
        return min(live, key=lambda r: (r.in_flight, r.reported_load, (r._order - turn) % n))

    def unavailable(self) -> GatewayError:
        why = "; ".join(
            [
                *(f"{r.address}: {r.down_reason or 'down'}" for r in self.replicas if not r.draining),
                *(f"{name}: {err}" for name, err in self.resolve_errors.items()),
            ]
        )
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
        for r in self.candidates():
            if r.status is not None and r.status.ready:
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
            self.on_failure()  # a replica replaced under its name shows up in a fresh resolution

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
        probing: dict[int, asyncio.Task[None]] = {}  # id(replica) -> its probe in flight
        try:
            while True:
                self._wake.clear()
                now = time.monotonic()
                for replica in list(self.replicas):
                    key = id(replica)
                    if key not in probing and self._next_probe(replica, interval_s) <= now:
                        probing[key] = asyncio.create_task(self.probe(replica))
                        probing[key].add_done_callback(
                            functools.partial(self._probe_done, probing, key, replica)
                        )
                waits = [self._next_probe(r, interval_s) - now for r in self.replicas if id(r) not in probing]
                await wait_event(self._wake, max(min(waits, default=interval_s), 0.01))
        finally:
            watcher.cancel()
            for task in probing.values():
                task.cancel()
            await asyncio.gather(watcher, *probing.values(), return_exceptions=True)

    def _probe_done(
        self, probing: dict[int, asyncio.Task[None]], key: int, replica: Replica, task: asyncio.Task[None]
    ) -> None:
        probing.pop(key, None)
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.error("%s %s: probe raised %r", self.stage, replica.address, exc)
        self._wake.set()  # schedule this replica's next probe

    async def _watch_channels(self) -> None:
        """The health watch: a stage that exits or restarts drops its connection, and its channel leaves
        READY the moment it does, long before the next periodic probe. Probe right then; the probe's
        outcome (not the state change, which a GOAWAY or an idle timeout also causes) decides.

        The state is polled (``get_state`` is a cheap local read) rather than awaited with
        ``wait_for_state_change``: cancelling that wait leaves its watch pending inside gRPC, which then
        completes into an event loop that may be gone. The same poll drops draining replicas whose last
        stream has ended (callers give ``in_flight`` back directly)."""
        states: dict[int, grpc.ChannelConnectivity] = {}
        while True:
            for replica in self.replicas:
                new = replica.channel.get_state()
                if states.get(id(replica)) is _READY and new is not _READY:
                    replica.probe_now = True
                    self._wake.set()
                states[id(replica)] = new
            self.reap_drained()
            states = {id(r): states[id(r)] for r in self.replicas if id(r) in states}
            await asyncio.sleep(WATCH_POLL_S)

    async def close(self) -> None:
        for r in self.replicas:
            if r.link is not None:
                r.link.close()
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
                # The codec says UNAVAILABLE in its own name when it cannot reach the talker too (killed a
                # moment ago, not yet seen here): ask the talker before blaming the codec.
                await talkers.probe(talker)
                if talker.down:
                    tried_talkers.append(talker)
                else:
                    tried_codecs.append(codec)
            elif exc.reason.startswith("talker"):
                talkers.mark_down(talker, exc.text)
                tried_talkers.append(talker)
            else:
                raise
