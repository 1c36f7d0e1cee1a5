"""What the talker's and the codec's servicers share: the registry of open streams (for Status and the
drain), the Stream handler that drains one stream's outbox onto the wire, and the Status fields every stage
reports.

The stage's servicer subclasses ``StageServicer`` ahead of its generated gRPC base, so ``Stream`` here is
the one gRPC calls; it says how a call's stream object is made and adds its own Status fields. Handlers
never run model code and never re-raise ``asyncio.CancelledError`` (grpc/grpc#29248): cleanup runs in
``finally``. Imports no torch.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping
from typing import Any, Generic, TypeVar

import grpc

from voxstage import metrics
from voxstage.config import ChunkPlan
from voxstage.internal.v1 import stage_pb2
from voxstage.link.server import LinkContext, LinkSession
from voxstage.link.wire import Schema
from voxstage.stage.stream import StageStream
from voxstage.transport.host import local_hello
from voxstage.transport.payload import hello_to_proto
from voxstage.transport.shm import ShmWriter
from voxstage.transport.shm_reader import ShmReader

S = TypeVar("S", bound=StageStream)

# After its terminal a stage keeps the call open until the peer half-closes (docs/protocol.md §5): ending it
# first races the peer's next write (a credit, an ack), and grpc.aio then fails the peer's whole call with
# INTERNAL "Internal error from Core", dropping the terminal it had not read yet (grpc/grpc#36066).
PEER_CLOSE_GRACE_S = 1.0


class StageServicer(Generic[S]):
    # The per-request messages a link to this stage carries (docs/protocol.md §12): requests, responses.
    link_schemas: tuple[Schema, Schema]

    def __init__(
        self, worker: Any, *, plan: ChunkPlan, shm_writer: ShmWriter | None, identity: Mapping[str, Any]
    ) -> None:
        self.worker = worker  # the stage's TalkerWorker / CodecWorker (a voxstage.stage.worker.StageWorker)
        self.plan = plan
        self.shm_writer = shm_writer
        if shm_writer is not None:
            # A reader that stops acking shows here as a count that only grows (one writer per stage process).
            metrics.SHM_SLOTS_LENT.set_function(lambda: shm_writer.stats().slots_lent)
        self.identity = dict(identity)  # StageStatus fields fixed by the loaded model (model, family, ...)
        self.ready = False
        self.draining = False
        self.streams: dict[str, S] = {}
        self._idle = asyncio.Event()
        self._idle.set()

    # -- hooks -------------------------------------------------------------------------------------------
    def _new_stream(self, context: grpc.aio.ServicerContext) -> S:
        """The protocol state of one new Stream call."""
        raise NotImplementedError

    def _snapshot_fields(self, status: stage_pb2.StageStatus, snap: Any) -> Any:
        """Set the stage's own fields from the engine snapshot; return what ``stream.state`` reads."""
        raise NotImplementedError

    @property
    def link_reader(self) -> ShmReader | None:
        """This stage's reader of its downstream's shared memory (None: it reads none)."""
        return None

    # -- drain -------------------------------------------------------------------------------------------
    def active(self) -> int:
        return len(self.streams)

    async def wait_idle(self) -> None:
        await self._idle.wait()

    # -- handlers ----------------------------------------------------------------------------------------
    async def Stream(  # noqa: N802 - gRPC method name
        self, request_iterator: AsyncIterator[Any], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[Any]:
        stream = self._new_stream(context)
        if isinstance(context, LinkContext):
            stream.on_link = True
            context.take = stream.take
            stream.outbox.sink = context.emit
        self.streams[stream.key] = stream
        self._idle.clear()
        reader = asyncio.ensure_future(stream.read(request_iterator))
        try:
            while True:
                msg = await stream.outbox.get()
                yield msg
                if msg.HasField("end_of_stream"):
                    break
            await stream.loans.settle()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(reader), PEER_CLOSE_GRACE_S)
        except asyncio.CancelledError:
            pass  # the peer cancelled the call or went away: nothing more can be written
        finally:
            reader.cancel()
            stream.close()
            self.streams.pop(stream.key, None)
            if not self.streams:
                self._idle.set()

    async def Link(  # noqa: N802 - gRPC method name
        self, request_iterator: AsyncIterator[Any], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[Any]:
        """Every request of one downstream peer on one call: each is served by ``Stream`` as if it had a
        call of its own (voxstage.link.server)."""
        requests, responses = self.link_schemas
        link = LinkSession(self.Stream, requests, responses, writer=self.shm_writer, reader=self.link_reader)
        batches = link.run(request_iterator)
        try:
            async for batch in batches:
                yield batch
        except asyncio.CancelledError:
            pass  # the peer went away: never re-raised (grpc/grpc#29248); the link's cleanup runs below
        finally:
            await batches.aclose()

    async def _status(self, include_requests: bool) -> stage_pb2.StageStatus:
        """The StageStatus of a Status call: the model's identity and, while the engine lives, its slots,
        tick and (on request) each stream's state."""
        status = stage_pb2.StageStatus(
            ready=self.ready and not self.draining,
            active_streams=len(self.streams),
            transport=self.hello(),
            link=True,
            **self.identity,
        )
        if self.worker.failed is not None:
            return status
        snap = await self.worker.snapshot()
        status.slots_total = snap.slots_total
        status.slots_in_use = snap.slots_in_use
        status.tick = snap.ticks
        view = self._snapshot_fields(status, snap)
        if include_requests:
            status.requests.extend(s.state(view, snap.ticks) for s in list(self.streams.values()))
        return status

    def hello(self) -> stage_pb2.TransportHello:
        writer = self.shm_writer
        return hello_to_proto(
            local_hello(
                probe_region=writer.probe_region if writer is not None else "",
                shm_threshold_bytes=writer.threshold_bytes if writer is not None else 0,
            )
        )
