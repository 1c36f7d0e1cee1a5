"""``voxstage.internal.v1.Talker``: Stream (one request per call) and Status.

The servicer only moves messages between the wire and the engine's queues (``TalkerWorker``); the protocol
state of one call lives in ``TalkerStream``. Handlers never run model code and never re-raise
``asyncio.CancelledError`` (grpc/grpc#29248): cleanup runs in ``finally``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc

from voxstage.config import ChunkPlan
from voxstage.internal.v1 import stage_pb2, stage_pb2_grpc
from voxstage.talker.stream import TalkerStream
from voxstage.talker.worker import TalkerWorker
from voxstage.transport.host import local_hello
from voxstage.transport.payload import hello_to_proto
from voxstage.transport.shm import ShmWriter

SERVICE_NAME = "voxstage.internal.v1.Talker"


class TalkerServicer(stage_pb2_grpc.TalkerServicer):
    def __init__(self, worker: TalkerWorker, *, plan: ChunkPlan, shm_writer: ShmWriter | None) -> None:
        self.worker = worker
        info = worker.info
        self.model = info.model
        self.family = info.family
        self.num_groups = info.num_code_groups
        self.frame_rate_hz = info.frame_rate_hz
        self.plan = plan
        self.shm_writer = shm_writer
        self.ready = False
        self.draining = False
        self.streams: dict[str, TalkerStream] = {}
        self._idle = asyncio.Event()
        self._idle.set()

    def active(self) -> int:
        return len(self.streams)

    async def wait_idle(self) -> None:
        await self._idle.wait()

    async def Stream(  # noqa: N802 - gRPC method name
        self,
        request_iterator: AsyncIterator[stage_pb2.TalkerStreamRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[stage_pb2.TalkerStreamResponse]:
        stream = TalkerStream(self)
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
            pass  # the codec cancelled the call or went away: nothing more can be written
        finally:
            reader.cancel()
            stream.close()
            self.streams.pop(stream.key, None)
            if not self.streams:
                self._idle.set()

    async def Status(  # noqa: N802 - gRPC method name
        self, request: stage_pb2.TalkerStatusRequest, context: grpc.aio.ServicerContext
    ) -> stage_pb2.TalkerStatusResponse:
        status = stage_pb2.StageStatus(
            ready=self.ready and not self.draining,
            model=self.model,
            family=self.family,
            active_streams=len(self.streams),
            transport=self.hello(),
            num_code_groups=self.num_groups,
            frame_rate_hz=self.frame_rate_hz,
        )
        if self.worker.failed is not None:
            return stage_pb2.TalkerStatusResponse(status=status)
        snap = await self.worker.snapshot()
        status.slots_total = snap.slots_total
        status.slots_in_use = snap.slots_in_use
        status.queue_depth = snap.queue_depth
        status.tick = snap.ticks
        if request.include_requests:
            status.requests.extend(s.state(snap.requests, snap.ticks) for s in list(self.streams.values()))
        return stage_pb2.TalkerStatusResponse(status=status)

    def hello(self) -> stage_pb2.TransportHello:
        writer = self.shm_writer
        return hello_to_proto(
            local_hello(
                probe_region=writer.probe_region if writer is not None else "",
                shm_threshold_bytes=writer.threshold_bytes if writer is not None else 0,
            )
        )
