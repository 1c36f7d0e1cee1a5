"""A duplex codec double: ``Codec.Stream`` in ``STREAM_MODE_DUPLEX`` as docs/protocol.md §11 says, minus the
model. It answers ``open`` with ``opened`` granting 1 s of user audio, and for every 80 ms user frame it
receives it sends one 1920-sample agent frame (a tone) with a transcript delta and ``user_frame`` set to that
frame's index, within the gateway's agent credit, and re-grants the frame's user-audio credit. It ends with
``end_of_stream`` EOS on ``end_of_input`` and CANCELLED on ``cancel``, and can refuse sessions with
RESOURCE_EXHAUSTED (origin talker), as a talker with every slot held does. The real codec is tested in
tests/unit/codec and tests/integration.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import grpc
import numpy as np

from voxstage.internal.v1 import stage_pb2, stage_pb2_grpc

MODEL = "personaplex-tiny"
FAMILY = "personaplex"
RATE = 24_000
FRAME = 1920
USER_CREDIT = RATE  # 1 s jitter buffer, as the codec's default


def _eos(reason: int, code: grpc.StatusCode | None = None, message: str = "") -> Any:
    eos = stage_pb2.EndOfStream(reason=reason)
    if code is not None:
        eos.error.CopyFrom(stage_pb2.StreamError(code=code.value[0], message=message, origin="talker"))
    return stage_pb2.CodecStreamResponse(end_of_stream=eos)


async def _peer_close(reader: asyncio.Task[None]) -> None:
    """As a real stage does (protocol.md §5): end the call only once the gateway half-closed after the
    terminal, so none of its writes races the call's end."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(asyncio.shield(reader), 1.0)


@dataclass
class FakeDuplexCodec(stage_pb2_grpc.CodecServicer):
    refuse: bool = False  # every talker slot held: RESOURCE_EXHAUSTED at open
    fail_after_frames: int = 0  # > 0: an in-band INTERNAL error after that many agent frames
    opens: list[stage_pb2.StreamOpen] = field(default_factory=list)
    cancels: int = 0
    end_of_inputs: int = 0
    active: int = 0
    user_messages: int = 0
    protocol_errors: list[str] = field(default_factory=list)
    # request_id -> when its latest user frame arrived: a session whose client stops reading stops here
    last_user_audio: dict[str, float] = field(default_factory=dict)

    async def Status(self, request: Any, context: Any) -> stage_pb2.CodecStatusResponse:
        return stage_pb2.CodecStatusResponse(
            status=stage_pb2.StageStatus(
                ready=True, model=MODEL, family=FAMILY, slots_total=8, slots_in_use=self.active,
                active_streams=self.active, num_code_groups=8, frame_rate_hz=12.5, sample_rate_hz=RATE,
            )
        )  # fmt: skip

    async def Stream(self, request_iterator: AsyncIterator[Any], context: Any) -> AsyncIterator[Any]:
        it = aiter(request_iterator)
        first = await anext(it, None)
        if first is None or first.WhichOneof("request") != "open":
            yield _eos(stage_pb2.END_REASON_ERROR, grpc.StatusCode.INVALID_ARGUMENT, "open first")
            return
        op = first.open
        self.opens.append(op)
        if op.mode != stage_pb2.STREAM_MODE_DUPLEX or op.initial_credit.unit != stage_pb2.CREDIT_UNIT_SAMPLES:
            yield _eos(stage_pb2.END_REASON_ERROR, grpc.StatusCode.INVALID_ARGUMENT, "not a duplex open")
            return
        if self.refuse:
            yield _eos(stage_pb2.END_REASON_ERROR, grpc.StatusCode.RESOURCE_EXHAUSTED, "no free session slot")
            return
        self.active += 1
        try:
            async for msg in self._session(op, it):
                yield msg
        finally:
            self.active -= 1

    async def _session(self, op: stage_pb2.StreamOpen, it: AsyncIterator[Any]) -> AsyncIterator[Any]:
        yield stage_pb2.CodecStreamResponse(
            opened=stage_pb2.StreamOpened(
                request_id=op.request_id, model=MODEL, family=FAMILY, num_code_groups=8, frame_rate_hz=12.5,
                pcm_format=stage_pb2.PCM_FORMAT_F32LE, sample_rate_hz=RATE, channels=1,
                initial_credit=stage_pb2.Credit(unit=stage_pb2.CREDIT_UNIT_SAMPLES, amount=USER_CREDIT),
            )
        )  # fmt: skip
        inbox: asyncio.Queue[Any] = asyncio.Queue()

        async def read() -> None:
            with contextlib.suppress(Exception):
                async for msg in it:
                    await inbox.put(msg)
            await inbox.put(None)

        reader = asyncio.create_task(read())
        agent_credit = op.initial_credit.amount
        user_credit = USER_CREDIT
        received = 0  # user samples
        sent = 0  # agent frames
        owed: list[int] = []  # user frames waiting for agent credit
        try:
            while True:
                msg = await inbox.get()
                if msg is None:
                    return  # the gateway went away without a word
                kind = msg.WhichOneof("request")
                if kind == "user_audio":
                    chunk = msg.user_audio
                    self.user_messages += 1
                    self.last_user_audio[op.request_id] = time.monotonic()
                    if chunk.sample_count != FRAME or chunk.sample_offset != received:
                        self.protocol_errors.append(f"user_audio {chunk.sample_offset}+{chunk.sample_count}")
                    if chunk.sample_count > user_credit:
                        self.protocol_errors.append("user_audio beyond credit")
                    user_credit -= chunk.sample_count
                    owed.append(received // FRAME)
                    received += chunk.sample_count
                elif kind == "credit":
                    agent_credit += msg.credit.amount
                elif kind == "end_of_input":
                    self.end_of_inputs += 1
                    yield _eos(stage_pb2.END_REASON_EOS)
                    await _peer_close(reader)
                    return
                elif kind == "cancel":
                    self.cancels += 1
                    yield _eos(stage_pb2.END_REASON_CANCELLED)
                    await _peer_close(reader)
                    return
                while owed and agent_credit >= FRAME:
                    frame = owed.pop(0)
                    t = np.arange(sent * FRAME, (sent + 1) * FRAME) / RATE
                    pcm = (0.25 * np.sin(2 * np.pi * 300.0 * t)).astype("<f4")
                    yield stage_pb2.CodecStreamResponse(
                        pcm=stage_pb2.PcmChunk(
                            sample_offset=sent * FRAME, sample_count=FRAME, format=stage_pb2.PCM_FORMAT_F32LE,
                            data=stage_pb2.Payload(inline=pcm.tobytes()), first_frame=sent, frame_count=1,
                            transcript_delta=f"w{sent} ", user_frame=frame,
                        )
                    )  # fmt: skip
                    agent_credit -= FRAME
                    sent += 1
                    user_credit += FRAME
                    grant = stage_pb2.Credit(unit=stage_pb2.CREDIT_UNIT_SAMPLES, amount=FRAME)
                    yield stage_pb2.CodecStreamResponse(credit=grant)
                    if self.fail_after_frames and sent >= self.fail_after_frames:
                        yield _eos(stage_pb2.END_REASON_ERROR, grpc.StatusCode.INTERNAL, "engine exploded")
                        await _peer_close(reader)
                        return
        finally:
            reader.cancel()


@dataclass
class FakeDuplexTalker(stage_pb2_grpc.TalkerServicer):
    # What the checkpoint offers; None (the default): voices unknown, each one passed to the talker.
    catalog: stage_pb2.ModelCatalog | None = None

    async def Status(self, request: Any, context: Any) -> stage_pb2.TalkerStatusResponse:
        status = stage_pb2.StageStatus(
            ready=True, model=MODEL, family=FAMILY, slots_total=8, frame_rate_hz=12.5, sample_rate_hz=RATE
        )
        if self.catalog is not None:
            status.duplex = True
            status.catalog.CopyFrom(self.catalog)
        return stage_pb2.TalkerStatusResponse(status=status)


def stored_voices(*names: str) -> stage_pb2.ModelCatalog:
    """The catalog of a PersonaPlex checkpoint with these stored voices (sorted, as its talker lists them)."""
    voices = [stage_pb2.CatalogVoice(name=n, description="stored voice") for n in sorted(names)]
    return stage_pb2.ModelCatalog(voices=voices, variant="duplex", voice_clone=True, instructions=True)
