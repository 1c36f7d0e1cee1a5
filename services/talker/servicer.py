"""``voxstage.internal.v1.Talker``: Stream (one request per call) and Status.

The servicer only moves messages between the wire and the engine's queues (``TalkerWorker``); the protocol
state of one call lives in ``TalkerStream``. The Stream handler, the stream registry and the common Status
fields are ``voxstage.stage.servicer.StageServicer``'s.
"""

from __future__ import annotations

from collections.abc import Mapping

import grpc

from services.talker.duplex.stream import DuplexTalkerStream
from services.talker.duplex.worker import DuplexWorker
from services.talker.models import Catalog
from services.talker.stream import TalkerStream
from services.talker.voice_cache import VoiceCache
from services.talker.worker import RequestSnapshot, TalkerSnapshot, TalkerWorker
from voxstage.config import ChunkPlan
from voxstage.internal.v1 import stage_pb2, stage_pb2_grpc
from voxstage.link.wire import TALKER_REQUESTS, TALKER_RESPONSES
from voxstage.stage.servicer import StageServicer
from voxstage.transport.shm import ShmWriter

SERVICE_NAME = "voxstage.internal.v1.Talker"


class TalkerServicer(StageServicer[TalkerStream | DuplexTalkerStream], stage_pb2_grpc.TalkerServicer):
    worker: TalkerWorker | DuplexWorker
    link_schemas = (TALKER_REQUESTS, TALKER_RESPONSES)

    def __init__(
        self,
        worker: TalkerWorker | DuplexWorker,
        *,
        plan: ChunkPlan,
        shm_writer: ShmWriter | None,
        voices: VoiceCache | None = None,
    ) -> None:
        info = worker.info
        self.voices = voices  # ready prompts of voice-library voices (None: every request decodes its own)
        self.model = info.model
        self.family = info.family
        self.num_groups = info.num_code_groups
        self.frame_rate_hz = info.frame_rate_hz
        identity = {
            "model": self.model,
            "family": self.family,
            "num_code_groups": self.num_groups,
            "frame_rate_hz": self.frame_rate_hz,
            "duplex": isinstance(worker, DuplexWorker),
            "catalog": catalog_message(info.catalog, info.variant),
        }
        super().__init__(worker, plan=plan, shm_writer=shm_writer, identity=identity)

    def _new_stream(self, context: grpc.aio.ServicerContext) -> TalkerStream | DuplexTalkerStream:
        # The family decides: a duplex model serves duplex sessions only, a TTS model TTS only.
        if isinstance(self.worker, DuplexWorker):
            return DuplexTalkerStream(self)
        return TalkerStream(self)

    async def Status(  # noqa: N802 - gRPC method name
        self, request: stage_pb2.TalkerStatusRequest, context: grpc.aio.ServicerContext
    ) -> stage_pb2.TalkerStatusResponse:
        return stage_pb2.TalkerStatusResponse(status=await self._status(request.include_requests))

    def _snapshot_fields(
        self, status: stage_pb2.StageStatus, snap: TalkerSnapshot
    ) -> Mapping[str, RequestSnapshot]:
        status.queue_depth = snap.queue_depth
        if self.worker.budget is not None:
            self.worker.budget.fill(status)
        return snap.requests


def catalog_message(catalog: Catalog, variant: str) -> stage_pb2.ModelCatalog:
    """What the checkpoint offers, as ``StageStatus.catalog`` carries it to the gateway."""
    return stage_pb2.ModelCatalog(
        voices=[
            stage_pb2.CatalogVoice(name=v.name, languages=v.languages, description=v.description)
            for v in catalog.voices
        ],
        languages=catalog.languages,
        variant=variant,
        voice_clone=catalog.voice_clone,
        reference_required=catalog.reference_required,
        reference_text_required=catalog.reference_text_required,
        instructions=catalog.instructions,
        voice_required=catalog.voice_required,
    )
