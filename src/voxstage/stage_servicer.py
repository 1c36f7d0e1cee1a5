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
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Generic, Protocol, TypeVar

import grpc

from voxstage.internal.v1 import stage_pb2
from voxstage.loans import StreamLoans
from voxstage.transport.host import local_hello
from voxstage.transport.payload import hello_to_proto
from voxstage.transport.shm import ShmWriter


class StageStream(Protocol):
    """The per-call protocol state the Stream handler drives (``TalkerStream``, ``CodecStream``)."""

    key: str
    outbox: asyncio.Queue[Any]
    loans: StreamLoans

    def read(self, requests: AsyncIterator[Any]) -> Awaitable[None]: ...

    def close(self) -> None: ...

    def state(self, view: Any, tick: int) -> stage_pb2.RequestState: ...


S = TypeVar("S", bound=StageStream)


class StageServicer(Generic[S]):
    def __init__(self, new_stream: Callable[[grpc.aio.ServicerContext], S], shm_writer: ShmWriter | None) -> None:
        self._new_stream = new_stream
        self.shm_writer = shm_writer
        self.ready = False
        self.draining = False
        self.streams: dict[str, S] = {}
        self._idle = asyncio.Event()
        self._idle.set()

    def active(self) -> int:
        return len(self.streams)

    async def wait_idle(self) -> None:
        await self._idle.wait()

    async def Stream(  # noqa: N802 - gRPC method name
        self, request_iterator: AsyncIterator[Any], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[Any]:
        stream = self._new_stream(context)
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
        except asyncio.CancelledError:
            pass  # the peer cancelled the call or went away: nothing more can be written
        finally:
            reader.cancel()
            stream.close()
            self.streams.pop(stream.key, None)
            if not self.streams:
                self._idle.set()

    async def _status(self, worker: Any, include_requests: bool, **identity: Any) -> stage_pb2.StageStatus:
        """The StageStatus every stage reports: ``identity`` (model, family, ...) and, while the engine
        lives, its slots, tick and (on request) each stream's state."""
        status = stage_pb2.StageStatus(
            ready=self.ready and not self.draining,
            active_streams=len(self.streams),
            transport=self.hello(),
            **identity,
        )
        if worker.failed is not None:
            return status
        snap = await worker.snapshot()
        status.slots_total = snap.slots_total
        status.slots_in_use = snap.slots_in_use
        status.tick = snap.ticks
        view = self._snapshot_fields(status, snap)
        if include_requests:
            status.requests.extend(s.state(view, snap.ticks) for s in list(self.streams.values()))
        return status

    def _snapshot_fields(self, status: stage_pb2.StageStatus, snap: Any) -> Any:
        """Hook: set the stage's own fields from the engine snapshot; return what ``stream.state`` reads."""
        raise NotImplementedError

    def hello(self) -> stage_pb2.TransportHello:
        writer = self.shm_writer
        return hello_to_proto(
            local_hello(
                probe_region=writer.probe_region if writer is not None else "",
                shm_threshold_bytes=writer.threshold_bytes if writer is not None else 0,
            )
        )
