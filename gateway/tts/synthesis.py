"""The gateway's request path, shared by every public face: admit, route, stream, account.

``Synthesizer.run`` takes a checked ``SynthesisJob`` and a source of input (whole text, or streamed deltas
with flushes) and yields ``Started``, then float32 ``AudioOut`` chunks at the requested rate, a
``SegmentEnd`` after each segment's last audio, and ``Finished``. The face encodes and writes each chunk;
the code after each ``yield`` runs once the face asks for more, i.e. after the chunk went out, which is
when credit is returned to the codec and the chunk counts as heard (TTFA, underrun). Faces must close the
generator (``contextlib.aclosing``): closing it mid-stream cancels the codec stream and frees the slots.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncGenerator, AsyncIterable, AsyncIterator
from dataclasses import dataclass
from typing import Protocol

import grpc
import numpy as np

from gateway.accounting import RequestAccounting
from gateway.admission import Admission
from gateway.errors import GatewayError, invalid
from gateway.routing import Replica, ReplicaPool, open_on_pair
from gateway.text_budget import TakeBudget
from gateway.tts.first_input import FirstInput
from gateway.tts.request import SynthesisJob, check_text
from gateway.upstream import CodecStream, Pcm, Timeouts
from gateway.voices.store import encoded_reference
from voxstage.audio import StreamingResampler
from voxstage.config import DeployConfig
from voxstage.internal.v1 import stage_pb2
from voxstage.segments import SentenceFlusher
from voxstage.transport.host import local_hello
from voxstage.transport.payload import hello_to_proto
from voxstage.transport.shm_reader import ShmReader

# Frames granted up front when a take is decoded in one piece (async_chunk: false / non_streaming_mode)
# and the request names no frame budget: the whole take must fit the window (§3 never splits a chunk).
WHOLE_TAKE_FRAMES = 4096
# The codec stream's deadline runs this much past the client's. When the client's deadline passes, the
# gateway's handler is cancelled and sends `cancel`, which frees the slots within a tick; a deadline that
# expired on the codec call at the same instant would leave the codec to notice only at its next write.
DEADLINE_SLACK_S = 1.0


class Flush:
    """Input marker: synthesize what is buffered as one segment."""


FLUSH = Flush()
InputItem = str | Flush


@dataclass(frozen=True)
class Started:
    request_id: str
    sample_rate: int
    model: str
    voice: str


@dataclass(frozen=True)
class AudioOut:
    pcm: np.ndarray  # mono float32 at the job's output rate
    sample_offset: int
    segment_index: int


# Why a segment's take ended, by the stage's EndReason: the public faces name these (FinishReason).
FINISHES = {
    stage_pb2.END_REASON_EOS: "end_of_speech",
    stage_pb2.END_REASON_MAX_FRAMES: "max_frames",
    stage_pb2.END_REASON_FRAME_CAP: "frame_cap",
}


@dataclass(frozen=True)
class SegmentEnd:
    index: int
    samples: int
    ttfa_s: float
    duration_s: float
    finish: str = "end_of_speech"


@dataclass(frozen=True)
class Finished:
    request_id: str
    finish: str  # "end_of_speech" if every segment ended so, else the last other segment's FINISHES value
    segments: int
    samples: int
    frames: int
    audio_s: float
    ttfa_s: float
    total_s: float


Event = Started | AudioOut | SegmentEnd | Finished


class RunWatch(Protocol):
    """A face's own clocks over one run (``stream_watch.StreamWatch``): it is handed the codec stream once
    open, so that it can fail it, and told of each segment the codec finished, which may start its idle clock
    (the face's ``SegmentEnd`` event follows at once)."""

    def attach(self, stream: CodecStream) -> None: ...

    def segment_done(self) -> None: ...


async def whole_text(text: str) -> AsyncIterator[InputItem]:
    yield text


def _remaining(deadline: float | None) -> float | None:
    return None if deadline is None else deadline - time.monotonic()


class Synthesizer:
    def __init__(
        self,
        config: DeployConfig,
        codecs: ReplicaPool,
        talkers: ReplicaPool,
        admission: Admission,
        *,
        shm_reader: ShmReader | None = None,
    ) -> None:
        self.config = config
        self.codecs = codecs
        self.talkers = talkers
        self.admission = admission
        self.shm_reader = shm_reader
        extra = config.stream
        self.timeouts = Timeouts(first_chunk_s=extra.first_chunk_timeout_s, stall_s=extra.stall_timeout_s)
        self.max_text_chars = config.gateway.max_text_chars

    async def run(
        self,
        job: SynthesisJob,
        inputs: AsyncIterable[InputItem],
        acct: RequestAccounting,
        *,
        deadline: float | None = None,
        text_field: str = "text",
        watch: RunWatch | None = None,
        text_deltas: bool = False,
    ) -> AsyncGenerator[Event, None]:
        """``text_deltas``: ``inputs`` are a client's deltas (the talker may start a segment early)."""
        outcome = "error"
        acct.describe(job.request_id, job.voice_label or job.voice, job.model.name)
        try:
            async with (
                self.admission.slot(_remaining(deadline)),
                contextlib.aclosing(
                    self._admitted(job, inputs, acct, deadline, text_field, watch, text_deltas)
                ) as events,
            ):
                async for event in events:
                    yield event
            outcome = "ok"
        except GatewayError as exc:
            outcome = exc.outcome
            raise
        except (asyncio.CancelledError, GeneratorExit):
            outcome = "cancelled"
            raise
        finally:
            acct.finish(outcome)

    # -- routing and open -------------------------------------------------------------------------------

    def _credit_frames(self, job: SynthesisJob) -> tuple[int, int]:
        """(window, smallest chunk) in frames: §3's ``initial + 2 x steady``, or the whole take."""
        plan = self.config.chunk_plan
        initial = job.initial_chunk_frames or plan.initial_frames
        steady = job.steady_chunk_frames or plan.steady_frames
        if plan.whole_take or job.non_streaming:
            budget = job.sampling.max_frames if job.sampling.HasField("max_frames") else None
            frames = budget or self.config.talker.default_sampling_params.max_tokens or WHOLE_TAKE_FRAMES
            return frames + initial + steady, frames
        # Later chunks are at most steady ones (the ramp starts smaller): the stall clock needs room for one.
        return initial + 2 * steady, steady

    def _open_msg(
        self, job: SynthesisJob, codec: Replica, talker: Replica, text_deltas: bool = False
    ) -> tuple[stage_pb2.StreamOpen, int]:
        status = codec.status
        assert status is not None
        samples_per_frame = round(status.sample_rate_hz / status.frame_rate_hz) if status.frame_rate_hz else 1
        window, smallest = self._credit_frames(job)
        msg = stage_pb2.StreamOpen(
            request_id=job.request_id,
            mode=stage_pb2.STREAM_MODE_TTS,
            talker_address=talker.address,
            model=talker.status.model if talker.status is not None else job.model.name,
            voice=job.voice,
            language=job.language,
            instructions=job.instructions,
            sampling=job.sampling,
            subtalker_sampling=job.subtalker,
            non_streaming_mode=job.non_streaming,
            text_deltas=text_deltas,
            chunk_schedule=stage_pb2.ChunkSchedule(
                initial_chunk_frames=job.initial_chunk_frames, steady_chunk_frames=job.steady_chunk_frames
            ),
            pcm_format=stage_pb2.PCM_FORMAT_F32LE,
            sample_rate_hz=0,  # native: resampling happens here, next to the encoder
            initial_credit=stage_pb2.Credit(
                unit=stage_pb2.CREDIT_UNIT_SAMPLES, amount=window * samples_per_frame
            ),
        )
        if job.seed is not None:
            msg.seed = job.seed
        if job.reference is not None and job.reference.encoded is not None:
            msg.reference.CopyFrom(encoded_reference(job.reference.encoded))
        elif job.reference is not None:
            ref = job.reference
            msg.reference.audio.inline = np.ascontiguousarray(ref.pcm, dtype="<f4").tobytes()
            msg.reference.audio_format = stage_pb2.PCM_FORMAT_F32LE
            msg.reference.audio_sample_rate_hz = ref.sample_rate
            msg.reference.text = ref.text
        msg.transport.CopyFrom(hello_to_proto(local_hello()))
        return msg, smallest * samples_per_frame

    async def _open(
        self,
        job: SynthesisJob,
        deadline: float | None,
        text_deltas: bool,
        first: FirstInput[InputItem],
        whole_clip: bool = False,
    ) -> tuple[Replica, Replica, CodecStream, stage_pb2.StreamOpened]:
        async def attempt(codec: Replica, talker: Replica) -> tuple[CodecStream, stage_pb2.StreamOpened]:
            msg, min_chunk = self._open_msg(job, codec, talker, text_deltas)
            msg.whole_clip = whole_clip  # the client hears nothing before the end: never paced
            msg.initial_text, msg.initial_end_of_input = first.for_open()
            rate = codec.status.frame_rate_hz if codec.status is not None else 0.0
            stream = CodecStream(
                self.codecs,
                codec,
                timeouts=self.timeouts,
                deadline_s=None if deadline is None else deadline + DEADLINE_SLACK_S,
                shm_reader=self.shm_reader,
                tick_s=1.0 / rate if rate > 0 else 0.08,
            )
            try:
                return stream, await stream.open(msg, min_chunk_samples=min_chunk)
            except BaseException:
                stream.close()
                raise

        codec, talker, (stream, opened) = await open_on_pair(self.codecs, self.talkers, attempt)
        first.opened()
        return codec, talker, stream, opened

    # -- streaming --------------------------------------------------------------------------------------

    async def _pump(
        self,
        job: SynthesisJob,
        first: FirstInput[InputItem],
        stream: CodecStream,
        acct: RequestAccounting,
        segment_starts: list[float],
        text_field: str,
        flusher: SentenceFlusher | None = None,
    ) -> None:
        """Forward client input to the codec; a client error ends the request through ``stream.fail``.
        With ``flusher`` (``auto_flush: sentence``) a flush also goes wherever a sentence ends. The text the
        open carried (``first.sent``) is counted and checked here like any other, but not sent again."""
        total = 0
        pending = False
        take = TakeBudget(job, text_field)
        try:
            async for item in first.items():
                if not item:
                    continue
                if not isinstance(item, Flush):
                    check_text(item, text_field, self.max_text_chars, already=total, delta=True)
                    total += len(item)
                elif flusher is not None:
                    flusher.flushed()
                pieces = [item] if flusher is None or isinstance(item, Flush) else flusher.feed(item)
                for piece in pieces:
                    if piece is None or isinstance(piece, Flush):
                        if pending:  # an empty flush would ask the talker for an empty segment
                            pending = False
                            take.flushed()
                            await stream.flush()
                        continue
                    take.add(piece)
                    early = piece is first.sent
                    if piece.strip() and not pending:
                        pending = True
                        segment_starts.append(first.sent_at if early else time.monotonic())
                        acct.start_work(segment_starts[-1])
                    if early:
                        first.sent = None  # it rode in the open
                        continue
                    await stream.send_text(piece)
            if not segment_starts:
                raise invalid(text_field, "no text was sent before the end of input", reason="empty_text")
            await stream.end_of_input(owes_segment=pending, sent=first.ended_in_open)
        except GatewayError as exc:
            stream.fail(exc)
        except Exception as exc:  # a broken client iterator must end this request only
            stream.fail(GatewayError(grpc.StatusCode.INTERNAL, f"reading the request failed: {exc}"))

    async def _admitted(
        self,
        job: SynthesisJob,
        inputs: AsyncIterable[InputItem],
        acct: RequestAccounting,
        deadline: float | None,
        text_field: str,
        watch: RunWatch | None = None,
        text_deltas: bool = False,
    ) -> AsyncGenerator[Event, None]:
        flusher = SentenceFlusher() if text_deltas and self.config.gateway.auto_flush == "sentence" else None

        def passes(text: str) -> None:  # what the pump checks of a first text
            check_text(text, text_field, self.max_text_chars, delta=True)
            TakeBudget(job, text_field).add(text)

        first = FirstInput(inputs, passes, enabled=flusher is None)  # a flusher splits texts: no early one
        await first.settle()  # a text already on its way rides in the open
        try:
            opening = self._open(job, deadline, text_deltas, first, acct.whole_clip)
            codec, talker, stream, opened = await opening
        except BaseException:
            first.close()
            raise
        if watch is not None:
            watch.attach(stream)
        segment_starts: list[float] = []
        pump = asyncio.create_task(self._pump(job, first, stream, acct, segment_starts, text_field, flusher))
        try:
            yield Started(job.request_id, job.sample_rate, job.model.name, job.voice_label or job.voice)
            relay = self._relay(job, stream, opened, acct, segment_starts, watch)
            async with contextlib.aclosing(relay) as events:
                async for event in events:
                    yield event
        finally:
            pump.cancel()
            first.close()
            codec.in_flight -= 1
            talker.in_flight -= 1
            if stream.terminal is None:
                await asyncio.shield(stream.cancel("client gone or request failed"))
            else:
                stream.close()

    async def _relay(
        self,
        job: SynthesisJob,
        stream: CodecStream,
        opened: stage_pb2.StreamOpened,
        acct: RequestAccounting,
        segment_starts: list[float],
        watch: RunWatch | None = None,
    ) -> AsyncGenerator[Event, None]:
        rate = job.sample_rate
        native = opened.sample_rate_hz or rate
        resampler = StreamingResampler(native, rate)
        offset = 0
        segment = 0
        seg_samples: dict[int, int] = {}
        seg_first: dict[int, float] = {}
        segments_done = 0
        finish = "end_of_speech"

        def heard(out: np.ndarray, seg: int) -> None:
            """``out`` of segment ``seg`` went out (the face asked for more): it counts as heard now."""
            nonlocal offset
            now = time.monotonic()
            first_of_segment = seg not in seg_first
            seg_first.setdefault(seg, now)
            acct.on_audio_sent(out.size / rate, segment_start=first_of_segment and seg > 0, now=now)
            offset += out.size
            seg_samples[seg] = seg_samples.get(seg, 0) + out.size

        def segment_end(done: stage_pb2.SegmentDone) -> SegmentEnd:
            i = done.segment_index
            start = segment_starts[i] if i < len(segment_starts) else acct.arrival
            now = time.monotonic()
            finish = FINISHES.get(done.reason, "end_of_speech")
            return SegmentEnd(i, seg_samples.get(i, 0), seg_first.get(i, now) - start, now - start, finish)

        while True:
            event = await stream.next_event()
            if isinstance(event, Pcm):
                segment = event.segment_index
                out = resampler.process(_to_float(event))
                if out.size:
                    yield AudioOut(out, offset, segment)
                    heard(out, segment)
                await stream.grant(event.sample_count)
            elif isinstance(event, stage_pb2.SegmentDone):
                # The codec sends it after the segment's last PCM: flush what the resampler still holds of
                # the segment and report it now (the next take starts a fresh resampler: a new take is a new
                # utterance, so nothing carries across the seam).
                tail = resampler.process(np.zeros(0, np.float32), last=True)
                if tail.size:
                    yield AudioOut(tail, offset, event.segment_index)
                    heard(tail, event.segment_index)
                resampler = StreamingResampler(native, rate)
                segments_done += 1
                if event.reason not in (stage_pb2.END_REASON_UNSPECIFIED, stage_pb2.END_REASON_EOS):
                    finish = FINISHES.get(event.reason, finish)
                if watch is not None:
                    watch.segment_done()
                yield segment_end(event)
            else:
                if event.reason not in FINISHES:
                    raise stream.error_of(event)
                tail = resampler.process(np.zeros(0, np.float32), last=True)
                if tail.size:
                    yield AudioOut(tail, offset, segment)
                    heard(tail, segment)
                now = time.monotonic()
                yield Finished(
                    request_id=job.request_id,
                    finish=finish,
                    segments=segments_done,
                    samples=offset,
                    frames=event.frame_count,
                    audio_s=offset / rate,
                    ttfa_s=acct.ttfa_s or 0.0,
                    total_s=now - acct.arrival,
                )
                return


def _to_float(chunk: Pcm) -> np.ndarray:
    if chunk.format == stage_pb2.PCM_FORMAT_S16LE:
        return np.frombuffer(chunk.data, dtype="<i2").astype(np.float32) / 32768.0
    return np.frombuffer(chunk.data, dtype="<f4").astype(np.float32, copy=False)
