"""``voxstage.internal.v1.Codec``: Stream (one request per call, relayed to a talker) and Status.

Moves messages between the gateway, the talker and the codec engine's queues (``CodecWorker``, or
``DuplexCodecWorker`` for a duplex family); the state of one call lives in ``CodecStream`` (text to speech)
or ``DuplexCodecStream``. The Stream handler, the stream registry and the common Status fields are
``voxstage.stage.servicer.StageServicer``'s.
"""

from __future__ import annotations

import grpc

from services.codec.duplex.stream import DuplexCodecStream
from services.codec.duplex.worker import DuplexCodecSnapshot, DuplexCodecWorker
from services.codec.stream import CodecStream
from services.codec.upstream import TalkerPool
from services.codec.voice_reference import encode_voice
from services.codec.worker import CodecSnapshot, CodecWorker
from voxstage.config import ChunkPlan, ConnectorExtra
from voxstage.internal.v1 import stage_pb2, stage_pb2_grpc
from voxstage.link.wire import CODEC_REQUESTS, CODEC_RESPONSES
from voxstage.stage.errors import StageFailure
from voxstage.stage.servicer import StageServicer
from voxstage.transport.shm import ShmWriter
from voxstage.transport.shm_reader import ShmReader

SERVICE_NAME = "voxstage.internal.v1.Codec"


class CodecServicer(StageServicer[CodecStream | DuplexCodecStream], stage_pb2_grpc.CodecServicer):
    worker: CodecWorker | DuplexCodecWorker
    link_schemas = (CODEC_REQUESTS, CODEC_RESPONSES)

    def __init__(
        self,
        worker: CodecWorker | DuplexCodecWorker,
        *,
        plan: ChunkPlan,
        stream_config: ConnectorExtra,
        shm_writer: ShmWriter | None,
        pool: TalkerPool,
    ) -> None:
        rt = worker.runtime
        identity = {
            "model": rt.model,
            "family": rt.family,
            "num_code_groups": rt.num_groups,
            "frame_rate_hz": rt.frame_rate_hz,
            "sample_rate_hz": rt.sample_rate,
            "duplex": isinstance(worker, DuplexCodecWorker),
        }
        super().__init__(worker, plan=plan, shm_writer=shm_writer, identity=identity)
        self.stream_config = stream_config
        self.pool = pool

    @property
    def link_reader(self) -> ShmReader | None:
        return self.pool.reader

    def _new_stream(self, context: grpc.aio.ServicerContext) -> CodecStream | DuplexCodecStream:
        # The family decides: a duplex model serves duplex sessions only, a TTS model TTS only.
        if isinstance(self.worker, DuplexCodecWorker):
            return DuplexCodecStream(self, context)
        return CodecStream(self, context)

    async def Status(  # noqa: N802 - gRPC method name
        self, request: stage_pb2.CodecStatusRequest, context: grpc.aio.ServicerContext
    ) -> stage_pb2.CodecStatusResponse:
        return stage_pb2.CodecStatusResponse(status=await self._status(request.include_requests))

    async def EncodeVoice(  # noqa: N802 - gRPC method name
        self, request: stage_pb2.EncodeVoiceRequest, context: grpc.aio.ServicerContext
    ) -> stage_pb2.EncodeVoiceResponse:
        rt = self.worker.runtime
        try:
            if self.draining or not self.ready:
                raise StageFailure("UNAVAILABLE", f"codec is {'draining' if self.draining else 'not ready'}")
            if request.model and request.model != rt.model:
                why = f"model: this codec serves {rt.model!r}, not {request.model!r}"
                raise StageFailure("NOT_FOUND", why)
            duplex = isinstance(self.worker, DuplexCodecWorker)
            ref = await encode_voice(self.worker, rt, request.reference, duplex=duplex)
        except StageFailure as exc:
            await context.abort(grpc.StatusCode[exc.code], exc.message)
            raise  # abort raises; this only satisfies the type checker
        return stage_pb2.EncodeVoiceResponse(reference=ref)

    def _snapshot_fields(
        self, status: stage_pb2.StageStatus, snap: CodecSnapshot | DuplexCodecSnapshot
    ) -> dict[str, int] | DuplexCodecSnapshot:
        return snap if isinstance(snap, DuplexCodecSnapshot) else snap.buffered
