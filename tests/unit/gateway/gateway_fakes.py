"""Test doubles for the stages behind the gateway: real grpc.aio servers speaking the internal protocol.

``FakeCodec`` implements ``Codec.Stream`` as docs/protocol.md describes it (open first, ``opened``, PCM
chunks on the chunk schedule and only within credit, ``segment_done`` per segment, exactly one terminal,
errors in-band, ``cancel`` answered with ``end_of_stream{CANCELLED}``) with scripted audio: every
non-blank character of a segment's text becomes ``frames_per_char`` frames of a sine tone, so a test knows
the exact length to expect. Markers in the text script failures. Like a real stage it offers a link
(``Codec.Link``, served by the stages' own link code, voxstage.link.server, around the same ``Stream``
handler), so the gateway carries its requests there; ``FakeCodec(link=False)`` is a codec older than links,
which the gateway reaches by a ``Stream`` call per request. The real stages are exercised end to end in
tests/integration.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import grpc
import numpy as np

from voxstage.internal.v1 import stage_pb2, stage_pb2_grpc
from voxstage.link.server import LinkSession
from voxstage.link.wire import CODEC_REQUESTS, CODEC_RESPONSES

SAMPLE_RATE = 24_000
FRAME_RATE = 12.5
SAMPLES_PER_FRAME = int(SAMPLE_RATE / FRAME_RATE)
MODEL = "qwen3-tts-tiny"

# Text markers that script failures.
FAIL_MARKER = "[fail]"  # after the first chunk: end_of_stream{ERROR, INTERNAL, origin talker}
DROP_MARKER = "[drop]"  # after the first chunk: return without a terminal (a crashed codec)
HANG_MARKER = "[hang]"  # never produce audio (first-chunk timeout)
TALKER_DOWN_VOICE = "talkerdown"  # refuse at open: UNAVAILABLE from the talker


def expected_samples(text: str, frames_per_char: int = 1) -> int:
    return sum(not c.isspace() for c in text) * frames_per_char * SAMPLES_PER_FRAME


def _eos(
    reason: int, frames: int = 0, samples: int = 0, *, code: int = 0, message: str = "", origin: str = ""
) -> Any:
    eos = stage_pb2.EndOfStream(reason=reason, frame_count=frames, sample_count=samples)
    if code:
        eos.error.CopyFrom(stage_pb2.StreamError(code=code, message=message, origin=origin))
    return stage_pb2.CodecStreamResponse(end_of_stream=eos)


def _error(code: grpc.StatusCode, message: str, origin: str = "codec") -> Any:
    return _eos(stage_pb2.END_REASON_ERROR, code=code.value[0], message=message, origin=origin)


@dataclass
class FakeCodec(stage_pb2_grpc.CodecServicer):
    frames_per_char: int = 1
    frame_delay_s: float = 0.0  # wall time per generated frame (0.08 = real time at 12.5 Hz)
    ready: bool = True
    max_streams: int = 64
    opens: list[stage_pb2.StreamOpen] = field(default_factory=list)
    cancels: int = 0
    active: int = 0  # handlers running (until the downstream half-closes after the terminal)
    max_active: int = 0
    # Streams opened whose terminal is not yet sent: the work the gateway has asked for at once. A stream the
    # gateway ended leaves this at once; it leaves `active` only when its half-close is read, a few loop
    # steps later, and on a link the next requests' opens can be read first.
    working: int = 0
    max_working: int = 0
    credits: list[int] = field(default_factory=list)
    half_close_wait_s: float = 1.0
    dead_talkers: set[str] = field(default_factory=set)
    deadlines: list[float | None] = field(default_factory=list)
    half_closed_after_terminal: int = 0
    link: bool = True  # offers Codec.Link (StageStatus.link)
    links: int = 0  # Link calls served
    streams: int = 0  # Stream calls served

    async def Status(self, request: Any, context: Any) -> stage_pb2.CodecStatusResponse:
        return stage_pb2.CodecStatusResponse(
            status=stage_pb2.StageStatus(
                ready=self.ready,
                model=MODEL,
                family="qwen3_tts",
                slots_total=self.max_streams,
                slots_in_use=self.active,
                active_streams=self.active,
                num_code_groups=16,
                frame_rate_hz=FRAME_RATE,
                sample_rate_hz=SAMPLE_RATE,
                link=self.link,
            )
        )

    async def Link(self, batches: AsyncIterator[Any], context: Any) -> AsyncIterator[Any]:  # noqa: N802
        if not self.link:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, "Method not found!")
        self.links += 1
        session = LinkSession(self._serve, CODEC_REQUESTS, CODEC_RESPONSES, writer=None, reader=None)
        out = session.run(batches)
        try:
            async for batch in out:
                yield batch
        except asyncio.CancelledError:
            pass
        finally:
            await out.aclose()

    async def Stream(self, request_iterator: AsyncIterator[Any], context: Any) -> AsyncIterator[Any]:
        self.streams += 1
        async for msg in self._serve(request_iterator, context):
            yield msg

    async def _serve(self, request_iterator: AsyncIterator[Any], context: Any) -> AsyncIterator[Any]:
        it = aiter(request_iterator)
        first = await anext(it, None)
        if first is None or first.WhichOneof("request") != "open":
            yield _error(grpc.StatusCode.INVALID_ARGUMENT, "first message must be open")
            return
        op = first.open
        self.opens.append(op)
        self.deadlines.append(context.time_remaining())
        plan = (op.chunk_schedule.initial_chunk_frames or 1, op.chunk_schedule.steady_chunk_frames or 25)
        need = (plan[0] + plan[1]) * SAMPLES_PER_FRAME
        if op.initial_credit.unit != stage_pb2.CREDIT_UNIT_SAMPLES or op.initial_credit.amount < need:
            yield _error(grpc.StatusCode.INVALID_ARGUMENT, f"initial_credit below one chunk ({need} samples)")
            return
        if op.voice == TALKER_DOWN_VOICE or op.talker_address in self.dead_talkers:
            yield _error(grpc.StatusCode.UNAVAILABLE, "talker not reachable", origin="talker")
            return
        if op.voice == "nobody":
            yield _error(grpc.StatusCode.NOT_FOUND, "speaker: 'nobody' is not a preset speaker", "talker")
            return
        self.active += 1
        self.max_active = max(self.max_active, self.active)
        self.working += 1
        self.max_working = max(self.max_working, self.working)
        session = _Session(self, op, it, plan)
        terminal = False
        try:
            async for msg in session.run():
                if msg.HasField("end_of_stream"):
                    terminal = True
                    self.working -= 1
                yield msg
            # Keep the call open until the downstream half-closes: a credit the gateway wrote just as the call
            # ended would otherwise fail and turn the call INTERNAL on its side (see gateway/upstream.py).
            if terminal:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(session.reader), self.half_close_wait_s)
                    self.half_closed_after_terminal += 1
        finally:
            self.active -= 1
            if not terminal:
                self.working -= 1
            session.stop()


class _Session:
    def __init__(self, codec: FakeCodec, op: Any, it: AsyncIterator[Any], plan: tuple[int, int]) -> None:
        self.codec = codec
        self.op = op
        self.plan = plan
        self.credit = op.initial_credit.amount
        self.inbox: asyncio.Queue[Any] = asyncio.Queue()
        self.reader = asyncio.ensure_future(self._read(it))
        self.buffer = op.initial_text  # the first text may ride in the open (docs/protocol.md §2)
        self.segments: deque[str] = deque()
        self.ended = False
        if op.initial_end_of_input:  # and the end of input with it
            self.segments.append(self.buffer)
            self.buffer, self.ended = "", True
        self.cancelled = False
        self.protocol_error = ""

    async def _read(self, it: AsyncIterator[Any]) -> None:
        with contextlib.suppress(Exception):
            async for msg in it:
                await self.inbox.put(msg)
        await self.inbox.put(None)

    def stop(self) -> None:
        self.reader.cancel()

    def _handle(self, msg: Any) -> None:
        if msg is None:
            if not self.ended:
                self.protocol_error = "half-close before end_of_input"
            return
        kind = msg.WhichOneof("request")
        if kind == "text":
            self.buffer += msg.text
        elif kind in ("flush", "end_of_input"):
            if self.buffer.strip():
                self.segments.append(self.buffer)
            self.buffer = ""
            self.ended = self.ended or kind == "end_of_input"
        elif kind == "credit":
            self.codec.credits.append(msg.credit.amount)
            self.credit += msg.credit.amount
        elif kind == "cancel":
            self.cancelled = True
            self.codec.cancels += 1
        elif kind == "open":
            self.protocol_error = "second open"

    async def _work(self, seconds: float) -> None:
        """Spend ``seconds`` generating while still taking messages, as a real stage answers cancel within
        a tick."""
        end = time.monotonic() + seconds
        while not self.cancelled and (left := end - time.monotonic()) > 0:
            with contextlib.suppress(TimeoutError):
                self._handle(await asyncio.wait_for(self.inbox.get(), left))

    async def _pump_one(self) -> None:
        self._handle(await self.inbox.get())
        while not self.inbox.empty():
            self._handle(self.inbox.get_nowait())

    async def run(self) -> AsyncIterator[Any]:
        yield stage_pb2.CodecStreamResponse(
            opened=stage_pb2.StreamOpened(
                request_id=self.op.request_id,
                model=MODEL,
                family="qwen3_tts",
                num_code_groups=16,
                frame_rate_hz=FRAME_RATE,
                pcm_format=stage_pb2.PCM_FORMAT_F32LE,
                sample_rate_hz=SAMPLE_RATE,
                channels=1,
                chunk_schedule=stage_pb2.ChunkSchedule(
                    initial_chunk_frames=self.plan[0], steady_chunk_frames=self.plan[1]
                ),
            )
        )
        frames_total = 0
        samples_total = 0
        index = 0
        while True:
            while not self.segments and not self.cancelled and not self.protocol_error:
                if self.ended:
                    yield _eos(stage_pb2.END_REASON_EOS, frames_total, samples_total)
                    return
                await self._pump_one()
            if self.cancelled:
                yield _eos(stage_pb2.END_REASON_CANCELLED, frames_total, samples_total)
                return
            if self.protocol_error:
                yield _error(grpc.StatusCode.INVALID_ARGUMENT, self.protocol_error)
                return
            text = self.segments.popleft()
            if HANG_MARKER in text:
                while not self.cancelled:
                    await self._pump_one()
                continue
            frames = sum(not c.isspace() for c in text) * self.codec.frames_per_char
            done = 0
            while done < frames:
                n = min(self.plan[0] if done == 0 else self.plan[1], frames - done)
                samples = n * SAMPLES_PER_FRAME
                while self.credit < samples and not self.cancelled:
                    await self._pump_one()
                if self.cancelled:
                    break
                if self.codec.frame_delay_s:
                    await self._work(self.codec.frame_delay_s * n)
                while not self.inbox.empty():
                    self._handle(self.inbox.get_nowait())
                if self.cancelled:
                    break
                t = (np.arange(samples_total, samples_total + samples) / SAMPLE_RATE).astype(np.float32)
                pcm = (0.3 * np.sin(2 * np.pi * 220.0 * t)).astype("<f4")
                yield stage_pb2.CodecStreamResponse(
                    pcm=stage_pb2.PcmChunk(
                        sample_offset=samples_total,
                        sample_count=samples,
                        format=stage_pb2.PCM_FORMAT_F32LE,
                        data=stage_pb2.Payload(inline=pcm.tobytes()),
                        segment_index=index,
                        first_frame=frames_total,
                        frame_count=n,
                    )
                )
                self.credit -= samples
                done += n
                frames_total += n
                samples_total += samples
                if FAIL_MARKER in text:
                    yield _error(grpc.StatusCode.INTERNAL, "engine exploded", origin="talker")
                    return
                if DROP_MARKER in text:
                    return
            if self.cancelled:
                continue
            yield stage_pb2.CodecStreamResponse(
                segment_done=stage_pb2.SegmentDone(
                    segment_index=index, frame_count=done, sample_count=done * SAMPLES_PER_FRAME
                )
            )
            index += 1


@dataclass
class FakeTalker(stage_pb2_grpc.TalkerServicer):
    ready: bool = True
    model: str = MODEL
    # What the served checkpoint offers (``catalog`` below); None: a talker older than the catalog.
    catalog: stage_pb2.ModelCatalog | None = field(default_factory=lambda: catalog())

    async def Status(self, request: Any, context: Any) -> stage_pb2.TalkerStatusResponse:
        return stage_pb2.TalkerStatusResponse(
            status=stage_pb2.StageStatus(
                ready=self.ready,
                model=self.model,
                family="qwen3_tts",
                slots_total=4,
                frame_rate_hz=FRAME_RATE,
                sample_rate_hz=SAMPLE_RATE,
                catalog=self.catalog,
            )
        )


@dataclass
class StageDouble:
    server: grpc.aio.Server
    port: int
    servicer: Any

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"


async def start_codec(codec: FakeCodec | None = None, port: int = 0) -> StageDouble:
    servicer = codec or FakeCodec()
    server = grpc.aio.server()
    stage_pb2_grpc.add_CodecServicer_to_server(servicer, server)
    port = server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    return StageDouble(server, port, servicer)


async def start_talker(talker: FakeTalker | None = None) -> StageDouble:
    servicer = talker or FakeTalker()
    server = grpc.aio.server()
    stage_pb2_grpc.add_TalkerServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return StageDouble(server, port, servicer)


# The Qwen3-TTS built-in voice-alias table (gateway/voice_aliases.py) also names aiden and uncle_fu.
SPEAKERS = ["serena", "vivian", "ryan", "eric", "aiden", "uncle_fu"]
LANGUAGES = {"english": 2050, "chinese": 2055, "german": 2053, "sichuan_dialect": 2062}


def catalog(variant: str = "custom_voice") -> stage_pb2.ModelCatalog:
    """What a Qwen3-TTS talker of ``variant`` reports in ``StageStatus.catalog`` for a checkpoint with these
    speakers and languages (dialects are reached through their speakers, never named)."""
    languages = [name for name in LANGUAGES if "dialect" not in name]
    described = {"eric": "preset speaker (sichuan dialect)"}
    voices = [
        stage_pb2.CatalogVoice(
            name=name, languages=languages, description=described.get(name, "preset speaker")
        )
        for name in (SPEAKERS if variant == "custom_voice" else [])
    ]
    return stage_pb2.ModelCatalog(
        voices=voices,
        languages=languages,
        variant=variant,
        voice_clone=variant == "base",
        reference_required=variant == "base",
        instructions=variant != "base",
        voice_required=variant == "custom_voice",
    )
