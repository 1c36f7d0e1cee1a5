"""One Codec.Stream: relays a request between the gateway and a talker, decoding frames into PCM.

Three coroutines share this object on the event loop: the gateway reader (``read``), the talker reader
(``_read_talker``) and the talker writer (``_write_talker``); engine output arrives through ``on_pcm``.
Nothing here runs model code. Order of every message follows docs/protocol.md: the talker's ``opened``
before ours, PCM in frame order within the gateway's sample credit, frame credit back to the talker as PCM
leaves, and one ``end_of_stream`` last, relayed from the talker's.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import time
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import grpc
import numpy as np

from services.codec.engine import CodecOutput
from services.codec.relay import TalkerRefused, TalkerRelay
from services.codec.voice_reference import clone_reference
from voxstage import wire
from voxstage.audio import StreamingResampler
from voxstage.internal.v1 import stage_pb2
from voxstage.stage.errors import StageFailure
from voxstage.stage.stream import StageStream

if TYPE_CHECKING:
    from services.codec.servicer import CodecServicer

_keys = itertools.count(1)
S = stage_pb2


@dataclass
class _Piece:
    data: np.ndarray  # float32 PCM at the output rate
    first_frame: int
    frames: int
    segment: int
    done: S.SegmentDone | None = None  # a segment's end marker (no audio): its talker-side summary


class CodecStageStream(StageStream):
    """What the codec's TTS and duplex streams share: credit in samples, cancel, opening the talker's stream
    (a refusal relayed as our only message, the code groups checked), the terminal fence (with the relay's
    queued time and the PCM counts) and the teardown. Subclasses free their engine-side state in
    ``_release``."""

    role = "codec"
    peer = "gateway"
    credit_unit = S.CREDIT_UNIT_SAMPLES
    pcm_credit: int
    relay: TalkerRelay | None
    pieces: deque[Any]
    frames_sent: int
    samples_sent: int

    # Talker terminals that end the stream normally (its audio still goes out); others are relayed at once.
    talker_ends: tuple[int, ...] = (S.END_REASON_EOS, S.END_REASON_MAX_FRAMES)

    def _release(self) -> None:
        raise NotImplementedError

    def pump(self) -> None:
        raise NotImplementedError

    async def _talker_done(self, eos: S.EndOfStream) -> None:
        """The talker ended normally: send the rest of the audio, then our terminal."""
        raise NotImplementedError

    async def talker_ended(self, eos: S.EndOfStream, segment_done: S.SegmentDone | None) -> None:
        """The talker's terminal (called by the relay): its error or cancel relayed at once, a normal end
        after the last PCM."""
        if eos.reason == S.END_REASON_ERROR:
            self._release()
            e = eos.error
            self._terminal(S.END_REASON_ERROR, S.StreamError(code=e.code, message=e.message, origin=e.origin))
        elif eos.reason in self.talker_ends:
            await self._talker_done(eos)
        else:
            self._release()
            self._terminal(S.END_REASON_CANCELLED)

    def _grant(self, amount: int) -> None:
        self.pcm_credit += amount
        self.pump()

    def _cancel(self, cancel: S.Cancel) -> None:
        self._release()
        if self.relay is not None:
            self.relay.cancel(cancel.reason or "gateway cancelled")
        self._terminal(S.END_REASON_CANCELLED)

    async def _open_talker(self, op: S.StreamOpen, address: str, groups: int) -> bool:
        """Open the talker's stream through ``self.relay``; False when the talker refused (its error is then
        our only message)."""
        assert self.relay is not None
        try:
            talker: S.StreamOpened = await self.relay.open(op)
        except TalkerRefused as exc:  # no `opened` for us either: its error is our only message
            self._release()
            self._terminal(S.END_REASON_ERROR, exc.error)
            return False
        if talker.num_code_groups != groups:
            raise StageFailure(
                "FAILED_PRECONDITION",
                f"talker {address} emits {talker.num_code_groups} code groups; this codec decodes "
                f"{groups} (the two stages serve different models)",
            )
        return True

    def _terminal(self, reason: int, error: S.StreamError | None = None) -> None:
        if self.terminal_sent:
            return
        self.pieces.clear()
        queued = None if self.relay is None else self.relay.queued_s
        frames, samples = self.frames_sent, self.samples_sent
        self._send_terminal(reason, error, frames=frames, samples=samples, queued=queued)

    def fail(self, code: str, message: str) -> None:
        """An in-band error terminal: free the engine state, stop the talker call, then the terminal."""
        if self.terminal_sent:
            return
        self._release()
        if self.relay is not None:
            self.relay.cancel(message)
        self._terminal(S.END_REASON_ERROR, wire.stream_error(code, message, "codec"))

    def _response(self, **fields: Any) -> S.CodecStreamResponse:
        return S.CodecStreamResponse(**fields)

    def close(self) -> None:
        """The handler returns: free the engine-side state, stop the talker call, reclaim shm loans."""
        self._release()
        if self.relay is not None:
            self.relay.close()
        self.loans.close()


class CodecStream(CodecStageStream):
    refused = {"user_audio": "only duplex streams carry user audio"}
    talker_ends = (S.END_REASON_EOS, S.END_REASON_MAX_FRAMES, S.END_REASON_FRAME_CAP)

    def __init__(self, servicer: CodecServicer, context: grpc.aio.ServicerContext) -> None:
        super().__init__(f"cs{next(_keys)}")
        self.srv = servicer
        self.rt = servicer.worker.runtime
        self.context = context
        self.engine_open = False
        self.slot = -1
        self.fmt = S.PCM_FORMAT_S16LE
        self.rate = self.rt.sample_rate
        self.resampler: StreamingResampler | None = None
        self.steady = 1
        self.pcm_credit = 0
        self.pieces: deque[_Piece] = deque()
        self.decoded_frames = 0  # frames whose PCM is queued or sent
        self.frames_sent = 0
        self.samples_sent = 0
        self.decoded_all = False
        self.end_reason = S.END_REASON_EOS
        self.segment = 0  # the segment whose frames the engine decodes now
        self.talker_segments: deque[S.SegmentDone] = deque()  # ended takes whose audio is not all decoded
        self.segment_frames = self.segment_samples = 0  # of the segment being sent
        self.relay: TalkerRelay | None = None

    # -- gateway -> codec ----------------------------------------------------------------------------------
    async def _input(self, kind: str, msg: S.CodecStreamRequest) -> bool:
        if kind not in ("text", "flush", "end_of_input"):
            return False
        if self.end_of_input:
            raise StageFailure("INVALID_ARGUMENT", f"{kind}: received after end_of_input")
        self.end_of_input = kind == "end_of_input"
        assert self.relay is not None  # set by a successful open
        self.relay.forward_input(msg)
        return True

    async def _open(self, op: S.StreamOpen) -> None:
        srv, rt = self.srv, self.rt
        self._admit(op, srv, model=rt.model, family=rt.family)
        if not op.talker_address:
            raise StageFailure("INVALID_ARGUMENT", "talker_address: required (host:port of the talker)")
        await srv.pool.check(op.talker_address)  # --allowed-talkers: refused before a slot is taken or a dial
        plan = srv.plan
        sched = wire.resolve_schedule(
            op.chunk_schedule, plan.initial_frames, plan.steady_frames, plan.left_context_frames
        )
        self.steady = sched.steady_chunk_frames
        self.fmt = op.pcm_format or S.PCM_FORMAT_S16LE
        if self.fmt not in (S.PCM_FORMAT_S16LE, S.PCM_FORMAT_F32LE):
            raise StageFailure("INVALID_ARGUMENT", "pcm_format: must be PCM_FORMAT_S16LE or PCM_FORMAT_F32LE")
        self.rate = op.sample_rate_hz or rt.sample_rate
        if not 8000 <= self.rate <= 48000:
            raise StageFailure("INVALID_ARGUMENT", f"sample_rate_hz: {self.rate} is outside 8000..48000")
        if self.rate != rt.sample_rate:
            self.resampler = StreamingResampler(rt.sample_rate, self.rate)
        window_frames = sched.initial_chunk_frames + sched.steady_chunk_frames
        need = math.ceil(window_frames * rt.samples_per_frame * self.rate / rt.sample_rate)
        if op.initial_credit.unit != S.CREDIT_UNIT_SAMPLES or op.initial_credit.amount < need:
            raise StageFailure(
                "INVALID_ARGUMENT",
                f"initial_credit: need at least {need} SAMPLES ({window_frames} frames at {self.rate} Hz), "
                f"got {op.initial_credit.amount} in unit {S.CreditUnit.Name(op.initial_credit.unit)}",
            )
        self.pcm_credit = op.initial_credit.amount
        codes, xvec = await self._reference(op.reference)
        if not srv.worker.has_room():  # refused before the talker spends a prefill on it
            busy = f"all {srv.worker.engine.max_streams} codec streams are busy"
            raise StageFailure("RESOURCE_EXHAUSTED", busy)
        # The engine opens the stream (a clone's decoder state restored) while the talker opens and makes its
        # first frames: its answer is awaited after the talker's, off the way to the first audio. Marked open
        # now: if this handler is cancelled while the command is in flight, the engine still opens the
        # stream, and close() must free it.
        self.engine_open = True
        try:
            opening = srv.worker.open(
                self.key,
                initial_frames=sched.initial_chunk_frames,
                prefix=codes,
                listener=self,
                voice_key=op.reference.voice_key,
            )
        except StageFailure:
            self.engine_open = False
            raise
        try:
            talker_open = self._talker_open(op, sched, codes, xvec, window_frames)
            writer = srv.shm_writer
            self._lend_shm(writer, op)
            self.relay = TalkerRelay(self, srv.pool, op.talker_address, self.context.time_remaining())
            talked = await self._open_talker(talker_open, op.talker_address, rt.num_groups)
        except BaseException:
            await self._engine_opened(opening, refused_ok=True)
            raise
        # A refusal here (no free slot) ends the stream through fail(), which cancels the talker's call.
        await self._engine_opened(opening, refused_ok=not talked)
        if not talked:
            return
        if op.initial_text:  # it went to the talker inside its open (talker_open is a copy of ours)
            assert self.relay is not None
            self.end_of_input = op.initial_end_of_input
            self.relay.input_given(ended=op.initial_end_of_input)
        fmt = {"pcm_format": self.fmt, "sample_rate_hz": self.rate, "channels": 1}
        self._send_opened(op, rt, **fmt, chunk_schedule=sched, transport=self._hello(writer, op))

    def _talker_open(
        self,
        op: S.StreamOpen,
        sched: S.ChunkSchedule,
        codes: np.ndarray | None,
        xvec: np.ndarray | None,
        window_frames: int,
    ) -> S.StreamOpen:
        """The talker's ``open``: ours, with the schedule in force, the reference encoded, its own credit."""
        talker_open = S.StreamOpen()
        talker_open.CopyFrom(op)
        talker_open.ClearField("talker_address")
        talker_open.ClearField("pcm_format")
        talker_open.ClearField("sample_rate_hz")
        talker_open.mode = S.STREAM_MODE_TTS
        talker_open.chunk_schedule.CopyFrom(sched)
        if not op.reference.voice_key:  # a clip becomes its encoding; an encoded voice goes on as it came
            talker_open.reference.CopyFrom(wire.voice_reference(op.reference.text, codes, xvec))
        talker_open.initial_credit.CopyFrom(
            S.Credit(unit=S.CREDIT_UNIT_FRAMES, amount=window_frames + sched.steady_chunk_frames)
        )
        return talker_open

    async def _engine_opened(self, opening: asyncio.Task[int], refused_ok: bool) -> None:
        """The engine's answer to the open: the slot, or its refusal (raised unless ``refused_ok``: the
        stream already ends for another reason)."""
        try:
            self.slot = await opening
        except StageFailure:
            self.engine_open = False
            if not refused_ok:
                raise

    async def _reference(self, ref: S.VoiceReference) -> tuple[np.ndarray | None, np.ndarray | None]:
        """(ICL codes, x-vector) for a voice-clone request; both None without a reference."""
        return await clone_reference(self.srv.worker, self.rt, ref)

    # -- engine -> gateway -----------------------------------------------------------------------------
    def on_pcm(self, out: CodecOutput) -> None:
        if self.terminal_sent:
            return
        spf = self.rt.samples_per_frame
        # Split at steady-chunk size: the engine may decode several chunks in one go when the talker runs
        # ahead, and one PcmChunk must always fit the gateway's window (which holds at least one chunk).
        for start in range(0, out.frames, self.steady):
            n = min(self.steady, out.frames - start)
            pcm = out.pcm[start * spf : (start + n) * spf]
            last = out.final and start + n >= out.frames
            if self.resampler is not None:
                pcm = self.resampler.process(pcm, last=last)
            self.pieces.append(_Piece(pcm, self.decoded_frames, n, self.segment))
            self.decoded_frames += n
        if out.segment_end and self.talker_segments:
            done = self.talker_segments.popleft()
            self.pieces.append(_Piece(np.zeros(0, np.float32), self.decoded_frames, 0, self.segment, done))
            self.segment += 1
        if out.final:
            self.decoded_all = True
            self.engine_open = False
        self.pump()

    def on_engine_failed(self, message: str) -> None:
        self.engine_open = False
        self.fail("INTERNAL", f"codec engine failed: {message}")

    def on_request_failed(self, message: str) -> None:
        self.engine_open = False  # the engine already let the stream go
        self.fail("INTERNAL", message)

    def on_session_error(self, code: str, message: str) -> None:
        self.engine_open = False  # the worker already took the stream out of the engine
        self.fail(code, message)

    def pump(self) -> None:
        while self.pieces and not self.terminal_sent and self.pieces[0].data.size <= self.pcm_credit:
            piece = self.pieces.popleft()
            if piece.done is not None:
                self._send_segment_done(piece.done)
                continue
            if piece.data.size:
                self._send_pcm(piece)
            self.frames_sent += piece.frames
            self.segment_frames += piece.frames
            if self.relay is not None:
                self.relay.grant(piece.frames)  # that chunk's frames left the codec: the talker may refill
        if self.decoded_all and not self.pieces and not self.terminal_sent:
            self._terminal(self.end_reason)

    def _send_segment_done(self, talker: S.SegmentDone) -> None:
        done = S.SegmentDone(
            segment_index=talker.segment_index,
            frame_count=self.segment_frames,
            sample_count=self.segment_samples,
            reason=talker.reason,
        )
        self.outbox.put_nowait(S.CodecStreamResponse(segment_done=done))
        self.segment_frames = self.segment_samples = 0

    def _send_pcm(self, piece: _Piece) -> None:
        n = piece.data.size
        chunk = S.PcmChunk(
            sample_offset=self.samples_sent,
            sample_count=n,
            format=self.fmt,
            data=self.loans.payload(wire.pcm_to_bytes(piece.data, self.fmt)),
            segment_index=piece.segment,
            first_frame=piece.first_frame,
            frame_count=piece.frames,
            sent_unix_ns=time.time_ns(),
        )
        self.outbox.put_nowait(S.CodecStreamResponse(pcm=chunk))
        self.pcm_credit -= n
        self.samples_sent += n
        self.segment_samples += n
        if self.t_first is None:
            self.t_first = time.perf_counter()

    # -- called by the relay ---------------------------------------------------------------------------
    def frames_in(self, codes: np.ndarray) -> None:
        if self.engine_open:
            self.srv.worker.push(self.key, codes)

    async def segment_in(self, done: S.SegmentDone) -> None:
        """The talker ended a take: its frames (all pushed already) decode to their end, then its
        ``segment_done`` goes out behind their audio."""
        if not self.engine_open:
            return
        self.talker_segments.append(done)
        await self.srv.worker.end_segment(self.key)

    async def _talker_done(self, eos: S.EndOfStream) -> None:
        """Finish decoding, then relay the talker's reason (``segment_done``, the last take's, already
        arrived through ``segment_in``)."""
        self.end_reason = eos.reason
        if self.engine_open:
            await self.srv.worker.finish(self.key)

    # -- termination -----------------------------------------------------------------------------------
    def _release(self) -> None:
        if self.engine_open:
            self.engine_open = False
            self.srv.worker.cancel(self.key)
        self.pieces.clear()

    # -- status --------------------------------------------------------------------------------------------
    def state(self, buffered: dict[str, int], tick: int) -> S.RequestState:
        if self.terminal_sent:
            phase = S.REQUEST_PHASE_FINISHED
        elif self.pieces:
            phase = S.REQUEST_PHASE_BLOCKED_ON_CREDIT
        elif buffered.get(self.key) or self.decoded_frames:
            phase = S.REQUEST_PHASE_RUNNING
        else:
            phase = S.REQUEST_PHASE_WAITING_FOR_INPUT
        return S.RequestState(
            request_id=self.request_id,
            phase=phase,
            slot=self.slot if self.engine_open else -1,
            frame_count=self.decoded_frames,
            credit=self.pcm_credit,
            shm_slots_lent=self.loans.lent,
            last_tick=tick,
        )
