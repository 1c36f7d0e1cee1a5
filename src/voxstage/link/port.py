"""What both ends of a stage link share: the outgoing batch of this moment and the incoming slab.

Items are collected as the requests' handlers queue them, and one batch is cut per turn of the event loop
after the first item (two ``call_soon`` hops, so every request woken by one engine output has queued its
messages): the engine hands a tick's outputs to the loop in one callback, so one tick makes one batch.
User audio on the gateway's end is the exception: each client sends its frames on its own clock, so a
batch per frame would be the rule, and a batch costs a gRPC write at each end (the largest single cost
of a duplex session in the gateway's profile). A user-audio item therefore goes at once only when the
last batch left at least ``USER_AUDIO_LINGER_S`` ago, else with the batch due then (or sooner, with any
other item): at most one user-audio batch per window per link, and at most that much added to a frame's
way to the codec, which takes it at its next 80 ms tick. The body goes as one shared-memory slot when the
peer proved it can read our regions and it is larger than the threshold, else inline; the reader acks a
slot in its next batch. Imports no grpc.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from voxstage import metrics
from voxstage.internal.v1 import stage_pb2 as S
from voxstage.link.wire import ITEM, BatchBuilder, Schema
from voxstage.transport.counters import PATH_INLINE, PATH_SHM
from voxstage.transport.host import local_hello
from voxstage.transport.payload import ack_message, acked_refs, hello_to_proto, read_payload, to_payload
from voxstage.transport.shm import ShmRef, ShmSender, ShmWriter
from voxstage.transport.shm_reader import ShmReader

USER_AUDIO_LINGER_S = 0.005


class Inbox:
    """One request's incoming messages at one end of a link, in order, for its reader (``get``). ``take``,
    set by the request's code, handles a message at once instead (True: taken), skipping the reader's turn
    of the event loop; it is asked only while a reader waits on an empty inbox, so the order is the one the
    reader would keep (docs/protocol.md §12, "Past the event loop, in order")."""

    def __init__(self) -> None:
        self._queue: asyncio.Queue[Any] = asyncio.Queue()
        self._waiting = False  # a reader waits in ``get``
        self.take: Callable[[Any], bool] | None = None

    def put(self, msg: Any) -> None:
        take = self.take
        if take is None or not self._waiting or not self._queue.empty() or not take(msg):
            self._queue.put_nowait(msg)

    def put_nowait(self, item: Any) -> None:
        """Queue ``item`` for the reader whatever ``take`` would say (the end of the request)."""
        self._queue.put_nowait(item)

    async def get(self) -> Any:
        self._waiting = True
        try:
            return await self._queue.get()
        finally:
            self._waiting = False


class Port:
    def __init__(self, schema: Schema, end: str) -> None:
        self.end = end  # "downstream" / "upstream": this end of the link, in the metrics
        self.builder = BatchBuilder(schema)
        self.sender: ShmSender | None = None  # set once the peer proved it reads our regions
        self.hello: S.TransportHello | None = None  # goes out with the next batch
        self.acks: list[ShmRef] = []
        self.wake = asyncio.Event()
        self._hops = 0  # call_soon hops left before the batch is cut (0: none scheduled)
        self._due: asyncio.TimerHandle | None = None  # the lingering user audio's cut
        self._last_cut = 0.0  # loop time of the last batch
        # The arm whose items may linger: user audio, on the downstream end (the gateway's).
        self._lingers = schema.pcm if end == "downstream" else None
        self.batches = 0

    # -- out ---------------------------------------------------------------------------------------------
    def add(self, request: int, msg: Any, *, timeout_ms: int = 0) -> None:
        self.builder.add(request, msg, timeout_ms=timeout_ms)
        if self._lingers is not None and msg.WhichOneof(self.builder.schema.oneof) == self._lingers:
            self._linger()
        else:
            self.schedule()

    def _linger(self) -> None:
        if self._hops or self._due is not None:
            return  # a cut is on its way already
        loop = asyncio.get_running_loop()
        due = self._last_cut + USER_AUDIO_LINGER_S
        if loop.time() >= due:
            self.schedule()
        else:
            self._due = loop.call_at(due, self._lingered)

    def _lingered(self) -> None:
        self._due = None
        self.schedule()

    def signal(self, request: int, kind: int, *, code: int = 0, details: str = "") -> None:
        self.builder.signal(request, kind, code=code, details=details)
        self.schedule()

    def schedule(self) -> None:
        if not self._hops:
            self._hops = 2
            asyncio.get_running_loop().call_soon(self._hop)

    def _hop(self) -> None:
        self._hops -= 1
        if self._hops:
            asyncio.get_running_loop().call_soon(self._hop)
        else:
            self.wake.set()

    def cut(self) -> Any:
        """This direction's Link message (``Schema.envelope``) with the batch of everything queued since the
        last one; None when there is nothing to send."""
        if self._due is not None:
            self._due.cancel()  # what lingered goes in this batch
            self._due = None
        if not len(self.builder) and not self.acks and self.hello is None:
            return None
        self._last_cut = asyncio.get_running_loop().time()
        items, body = self.builder.take()
        count = len(items) // ITEM.itemsize
        envelope = self.builder.schema.envelope()
        batch = envelope.batch
        batch.items = items
        if body:
            placed: bytes | ShmRef = self.sender.place(body) if self.sender is not None else body
            shm = isinstance(placed, ShmRef)
            metrics.TRANSPORT_BYTES.labels(path=PATH_SHM if shm else PATH_INLINE).inc(len(body))
            batch.body.CopyFrom(to_payload(placed))
        if self.acks:
            batch.shm_ack.CopyFrom(ack_message(self.acks))
            self.acks = []
        if self.hello is not None:
            batch.hello.CopyFrom(self.hello)
            self.hello = None
        if len(self.builder):
            self.wake.set()  # more than one batch's worth was queued: the rest goes right after
        self.batches += 1
        metrics.LINK_BATCHES.labels(end=self.end).inc()
        metrics.LINK_ITEMS.labels(end=self.end).inc(count)
        return envelope

    # -- in ----------------------------------------------------------------------------------------------
    def receive(self, batch: S.LinkBatch, reader: ShmReader | None) -> bytes:
        """The batch's body (copied out of shared memory, the slot acked with our next batch); frees our own
        slots the peer acked. Raises on a bad reference: the link is then broken."""
        if batch.HasField("shm_ack"):
            if self.sender is None:
                raise ValueError("shm_ack on a link that lent no shared memory")
            self.sender.ack(acked_refs(batch.shm_ack))
        if not batch.HasField("body"):
            return b""
        data, ref = read_payload(batch.body, reader)
        if ref is not None:
            self.acks.append(ref)
            self.schedule()
        return data

    def close(self) -> None:
        if self._due is not None:
            self._due.cancel()
            self._due = None
        if self.sender is not None:
            self.sender.close()
            self.sender = None


def hello_of(writer: ShmWriter | None, verified_peer_probe: str) -> S.TransportHello:
    """What one end of a link says of its shared-memory path in its first batch (both ends alike)."""
    return hello_to_proto(
        local_hello(
            probe_region=writer.probe_region if writer else "",
            shm_threshold_bytes=writer.threshold_bytes if writer else 0,
            verified_peer_probe=verified_peer_probe,
        )
    )
