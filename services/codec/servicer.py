"""``voxstage.internal.v1.Codec``: Stream (one request per call, relayed to a talker) and Status.

Moves messages between the gateway, the talker and the codec engine's queues (``CodecWorker``); the state
of one call lives in ``CodecStream``. Handlers never run model code and never re-raise
``asyncio.CancelledError`` (grpc/grpc#29248): cleanup runs in ``finally``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc

from voxstage.codec.stream import CodecStream
from voxstage.codec.upstream import TalkerPool
from voxstage.codec.worker import CodecWorker
from voxstage.config import ChunkPlan, ConnectorExtra
from voxstage.internal.v1 import stage_pb2, stage_pb2_grpc
from voxstage.transport.host import local_hello
from voxstage.transport.payload import hello_to_proto
from voxstage.transport.shm import ShmWriter

SERVICE_NAME = "voxstage.internal.v1.Codec"


class CodecServicer(stage_pb2_grpc.CodecServicer):
    def __init__(
        self,
        worker: CodecWorker,
        *,
        plan: ChunkPlan,
        stream_config: ConnectorExtra,
        shm_writer: ShmWriter | None,
        pool: TalkerPool,
    ) -> None:
        self.worker = worker
        self.plan = plan
        self.stream_config = stream_config
        self.shm_writer = shm_writer
        self.pool = pool
        self.ready = False
        self.draining = False
        self.streams: dict[str, CodecStream] = {}
        self._idle = asyncio.Event()
        self._idle.set()

    def active(self) -> int:
        return len(self.streams)

    async def wait_idle(self) -> None:
        await self._idle.wait()

    async def Stream(  # noqa: N802 - gRPC method name
        self,
        request_iterator: AsyncIterator[stage_pb2.CodecStreamRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[stage_pb2.CodecStreamResponse]:
        stream = CodecStream(self, context)
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
            pass  # the gateway cancelled the call or went away: nothing more can be written
        finally:
            reader.cancel()
            stream.close()
            self.streams.pop(stream.key, None)
            if not self.streams:
                self._idle.set()

    async def Status(  # noqa: N802 - gRPC method name
        self, request: stage_pb2.CodecStatusRequest, context: grpc.aio.ServicerContext
    ) -> stage_pb2.CodecStatusResponse:
        rt = self.worker.runtime
        writer = self.shm_writer
        status = stage_pb2.StageStatus(
            ready=self.ready and not self.draining,
            model=rt.model,
            family=rt.family,
            active_streams=len(self.streams),
            transport=hello_to_proto(
                local_hello(
                    probe_region=writer.probe_region if writer is not None else "",
                    shm_threshold_bytes=writer.threshold_bytes if writer is not None else 0,
                )
            ),
            num_code_groups=rt.num_groups,
            frame_rate_hz=rt.frame_rate_hz,
            sample_rate_hz=rt.sample_rate,
        )
        if self.worker.failed is not None:
            return stage_pb2.CodecStatusResponse(status=status)
        snap = await self.worker.snapshot()
        status.slots_total = snap.slots_total
        status.slots_in_use = snap.slots_in_use
        status.tick = snap.ticks
        if request.include_requests:
            status.requests.extend(s.state(snap.buffered, snap.ticks) for s in list(self.streams.values()))
        return stage_pb2.CodecStatusResponse(status=status)
