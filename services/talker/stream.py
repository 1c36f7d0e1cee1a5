"""One Talker.Stream: protocol state between the codec's messages and its engine requests, one per segment.

Lives on the event loop and never runs model code: it decodes the codec's messages, posts commands to the
``TalkerWorker`` and turns each take's ``TalkerOutput`` into batched ``CodecFrames`` that respect the
codec's frame credit (docs/protocol.md §2-§6).

Segments (docs/api.md "Segments"): every ``flush`` and the final ``end_of_input`` close a segment, and each
segment is its own take (engine request ``<key>.<index>``) with the stream's voice and settings. A closed
segment's take starts with its whole text (the model's default prompt). With ``early_start_chars`` (families
that stream text) a segment starts once that much of it is in, in streaming-text mode, and later deltas and
its flush are fed to the running take. A segment that becomes ready while another speaks is submitted at
once as that take's follower: the engine starts it the moment the previous take ends, ahead of its queue.
Frames go out take by take, each take's chunk schedule starting afresh, and each take ends with a
``segment_done`` carrying its frame count and finish reason. The stream ends after the last segment once
input has ended.
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from services.talker.engine import Finish, TalkerOutput
from services.talker.request_params import request_params
from services.talker.takes import Segment, Take, sendable
from services.talker.worker import RequestParams, RequestSnapshot
from voxstage import wire
from voxstage.internal.v1 import stage_pb2
from voxstage.stage.errors import StageFailure
from voxstage.stage.stream import StageStream

if TYPE_CHECKING:
    from services.talker.servicer import TalkerServicer

MAX_TEXT_CHARS = 1 << 16  # the gateway enforces the user-facing limit; this only bounds a buggy peer
_keys = itertools.count(1)


class TalkerStageStream(StageStream):
    """What the talker's text-to-speech and duplex streams share: credit in frames, the response type."""

    role = "talker"
    peer = "codec"
    credit_unit = stage_pb2.CREDIT_UNIT_FRAMES
    credit: int

    def pump(self) -> None:
        raise NotImplementedError

    def _grant(self, amount: int) -> None:
        self.credit += amount
        self.pump()

    def _response(self, **fields: Any) -> stage_pb2.TalkerStreamResponse:
        return stage_pb2.TalkerStreamResponse(**fields)


class TalkerStream(TalkerStageStream):
    refused = {"user_codes": "only duplex streams carry user codes"}

    def __init__(self, servicer: TalkerServicer) -> None:
        super().__init__(f"ts{next(_keys)}")
        self.servicer = servicer
        self.worker = servicer.worker
        self.policy = servicer.worker.defaults.segments
        self.params = RequestParams()
        self.non_streaming = False
        self.text_deltas = False
        self.whole_in_open = False  # the open carried the text and its end
        self.initial = self.steady = 1
        self.ramp = True
        self.credit = 0
        self.sent_frames = 0
        self.segments: deque[Segment] = deque()  # not started yet; the last may still take text
        self.takes: deque[Take] = deque()  # started, in order; takes[0] is the one whose frames go out
        self.by_key: dict[str, Take] = {}
        self.open_take: Take | None = None  # a started segment still taking text (early start)
        self.text_chars = 0
        self.engine_error: str | None = None
        self.failed_finish: Finish | None = None
        self.end_reason = stage_pb2.END_REASON_EOS
        self.finished_tick = 0

    # -- codec -> talker ------------------------------------------------------------------------------------
    async def _input(self, kind: str, msg: stage_pb2.TalkerStreamRequest) -> bool:
        if kind == "text":
            await self._text(msg.text)
        elif kind == "flush":
            self._no_input_after_end("flush")
            await self._close_segment()
        elif kind == "end_of_input":
            await self._end_of_input()
        else:
            return False
        return True

    def _cancel(self, cancel: stage_pb2.Cancel) -> None:
        running = [t for t in self.takes if t.finish is None]
        for take in running:
            self.worker.cancel(take.key)  # CANCELLED output -> terminal
        if not running:
            self._terminal(stage_pb2.END_REASON_CANCELLED)

    def _no_input_after_end(self, what: str) -> None:
        if self.end_of_input:
            raise StageFailure("INVALID_ARGUMENT", f"{what}: received after end_of_input")

    async def _open(self, op: stage_pb2.StreamOpen) -> None:
        srv = self.servicer
        self._admit(op, srv, model=srv.model, family=srv.family)
        sched = wire.resolve_schedule(op.chunk_schedule, srv.plan.initial_frames, srv.plan.steady_frames, 0)
        self.initial, self.steady = sched.initial_chunk_frames, sched.steady_chunk_frames
        self.ramp = srv.plan.ramp
        window = self.initial + self.steady
        if op.initial_credit.unit != stage_pb2.CREDIT_UNIT_FRAMES or op.initial_credit.amount < window:
            raise StageFailure(
                "INVALID_ARGUMENT",
                f"initial_credit: need at least {window} FRAMES (one first and one steady chunk), got "
                f"{op.initial_credit.amount} in unit {stage_pb2.CreditUnit.Name(op.initial_credit.unit)}",
            )
        self.credit = op.initial_credit.amount
        self.params = request_params(op, srv.voices)
        self.non_streaming = op.non_streaming_mode
        self.text_deltas = op.text_deltas
        self.worker.check_voice(self.params)
        self.worker.build_request(self.key, self.params, "", False)  # validates sampling and seed now
        writer = srv.shm_writer
        self._lend_shm(writer, op)
        self._send_opened(op, srv, chunk_schedule=sched, transport=self._hello(writer, op))
        # The first text (and the end of input) may come with the open: handled as their messages would be,
        # but for one thing: a text whose end came with it is whole, so it is never started early (a prompt
        # that needs the whole text, an in-context clone's, is then built at once, not on the end's turn).
        if op.initial_text:
            self.whole_in_open = op.initial_end_of_input
            await self._text(op.initial_text)
        if op.initial_end_of_input:
            await self._end_of_input()

    async def _end_of_input(self) -> None:
        self._no_input_after_end("end_of_input")
        self.end_of_input = True
        await self._close_segment()
        if not self.by_key and not self.segments:
            raise StageFailure("INVALID_ARGUMENT", "text: no text to speak before end_of_input")
        self.pump()

    async def _text(self, text: str) -> None:
        self._no_input_after_end("text")
        self.text_chars += len(text)
        if self.text_chars > MAX_TEXT_CHARS:
            raise StageFailure(
                "INVALID_ARGUMENT", f"text: more than {MAX_TEXT_CHARS} characters in one request"
            )
        if not text:
            return
        take = self.open_take
        if take is not None:
            take.segment.parts.append(text)
            await self._feed(take)
            return
        if not self.segments or self.segments[-1].closed:
            self.segments.append(Segment())
        self.segments[-1].parts.append(text)
        await self._advance()

    async def _close_segment(self) -> None:
        """``flush`` / ``end_of_input``: the segment taking text is complete (a blank one is dropped)."""
        take, self.open_take = self.open_take, None
        if take is not None:
            take.segment.closed = True
            await self._feed(take)
            return
        if self.segments and not self.segments[-1].closed:
            seg = self.segments[-1]
            if seg.text.strip():
                seg.closed = True
            else:
                self.segments.pop()
        await self._advance()

    async def _advance(self) -> None:
        """Start every segment that may start: closed ones, and an open one past ``early_start_chars``."""
        while self.segments and not self.terminal_sent:
            seg = self.segments[0]
            if not seg.closed and not self._early(seg):
                return
            self.segments.popleft()
            await self._start(seg)

    def _early(self, seg: Segment) -> bool:
        n = self.policy.early_start_chars
        explicit_whole = self.non_streaming or self.params.non_streaming is True or self.whole_in_open
        return n > 0 and self.text_deltas and not explicit_whole and len(seg.text.strip()) >= n

    async def _start(self, seg: Segment) -> None:
        index = len(self.by_key)
        text = seg.text
        limit, capped = self.worker.frame_limit(self.params, text)
        key = f"{self.key}.{index}"
        request = self.worker.build_request(key, self.params, text, seg.closed, max_frames=limit)
        follows = self.takes[-1].key if self.takes else None
        take = Take(index, key, seg, fed=len(text), complete=seg.closed, capped=capped)
        self.takes.append(take)
        self.by_key[key] = take
        if not seg.closed:
            self.open_take = take
        await self.worker.submit(request, self, follows=follows)

    async def _feed(self, take: Take) -> None:
        """Hand the engine the text (and completion) of an early-started take it does not have yet."""
        text = take.segment.text
        delta, complete = text[take.fed :], take.segment.closed
        if take.complete or (not delta and not complete) or take.finish is not None:
            return
        take.fed, take.complete = len(text), complete
        limit, take.capped = self.worker.frame_limit(self.params, text)
        try:
            await self.worker.push_text(take.key, delta, complete, max_frames=limit)
        except StageFailure as exc:
            if exc.code == "FAILED_PRECONDITION" or take.finish is not None:
                return  # the take already ended (EOS or frame budget) while text was in flight
            raise

    # -- engine -> codec --------------------------------------------------------------------------------
    def on_output(self, out: TalkerOutput) -> None:
        take = self.by_key.get(out.request_id)
        if take is None:
            return
        if out.codes.shape[0]:
            take.pending.append(out.codes)
            take.pending_frames += out.codes.shape[0]
        if out.finish is not None:
            # An early-started take that ends before its flush (max_frames, the cap) ends its segment: the
            # rest of the segment's text is not spoken; it is taken and dropped until the flush.
            take.finish = out.finish
            self.finished_tick = self.worker.engine.ticks
            if out.finish in (Finish.CANCELLED, Finish.ERROR):
                self.failed_finish = out.finish
                self.engine_error = out.error
        self.pump()

    def on_engine_failed(self, message: str) -> None:
        self.failed_finish = Finish.ERROR
        self.fail("INTERNAL", f"talker engine failed: {message}")

    def on_request_failed(self, message: str) -> None:
        self.failed_finish = Finish.ERROR
        self.fail("INTERNAL", message)

    def pump(self) -> None:
        if self.terminal_sent:
            return
        if self.failed_finish is Finish.CANCELLED:
            self._terminal(stage_pb2.END_REASON_CANCELLED)
            return
        if self.failed_finish is Finish.ERROR:
            self.fail("INTERNAL", self.engine_error or "talker engine error")
            return
        while self.takes:
            take = self.takes[0]
            done = take.finish is not None
            while n := sendable(
                take.sent, take.pending_frames, self.credit, self.initial, self.steady, done, self.ramp
            ):
                self._send_frames(take, n)
            if not done or take.pending_frames:
                return
            reason = take.reason()
            if reason != stage_pb2.END_REASON_EOS:
                self.end_reason = reason
            done_msg = stage_pb2.SegmentDone(segment_index=take.index, frame_count=take.sent, reason=reason)
            self.outbox.put_nowait(stage_pb2.TalkerStreamResponse(segment_done=done_msg))
            self.takes.popleft()
        if self.end_of_input and not self.segments and self.open_take is None:
            self._terminal(self.end_reason)

    def _send_frames(self, take: Take, n: int) -> None:
        buf = np.concatenate(take.pending) if len(take.pending) > 1 else take.pending[0]
        chunk, rest = buf[:n], buf[n:]
        take.pending = [rest] if rest.shape[0] else []
        take.pending_frames -= n
        self.outbox.put_nowait(
            stage_pb2.TalkerStreamResponse(
                frames=stage_pb2.CodecFrames(
                    first_frame=self.sent_frames,
                    frame_count=n,
                    num_groups=chunk.shape[1],
                    codes=self.loans.payload(wire.codes_to_bytes(chunk)),
                    segment_index=take.index,
                    sent_unix_ns=time.time_ns(),
                )
            )
        )
        self.credit -= n
        take.sent += n
        self.sent_frames += n
        if self.t_first is None:
            self.t_first = time.perf_counter()

    # -- termination ------------------------------------------------------------------------------------
    def fail(self, code: str, message: str) -> None:
        """End the stream with an in-band error and free the engine slots (the terminal is queued first)."""
        if self.terminal_sent:
            return
        self._terminal(stage_pb2.END_REASON_ERROR, wire.stream_error(code, message, "talker"))
        self._cancel_takes()

    def _cancel_takes(self) -> None:
        for take in self.by_key.values():
            if take.finish is None:
                self.worker.cancel(take.key)

    def _terminal(self, reason: int, error: stage_pb2.StreamError | None = None) -> None:
        if self.terminal_sent:
            return
        for take in self.takes:
            take.pending, take.pending_frames = [], 0
        first = next(iter(self.by_key), None)
        admitted = None if first is None else self.worker.admitted_at(first)
        queued = None if admitted is None else admitted - self.t_open
        self._send_terminal(reason, error, frames=self.sent_frames, queued=queued)

    def close(self) -> None:
        """The handler is returning (terminal written, or the call is dead): free everything."""
        self._cancel_takes()
        for key in self.by_key:
            self.worker.forget(key)
        self.loans.close()

    # -- status ---------------------------------------------------------------------------------------------
    def state(self, snapshot: Mapping[str, RequestSnapshot], tick: int) -> stage_pb2.RequestState:
        take = self.takes[0] if self.takes else None
        snap = None if take is None else snapshot.get(take.key)
        pending = 0 if take is None else take.pending_frames
        blocked = (
            take is not None
            and pending
            and not sendable(
                take.sent, pending, self.credit, self.initial, self.steady, take.finish is not None, self.ramp
            )
        )
        slot, last = -1, self.finished_tick
        if self.terminal_sent:
            phase = stage_pb2.REQUEST_PHASE_FINISHED
        elif take is None:
            phase, last = stage_pb2.REQUEST_PHASE_WAITING_FOR_INPUT, tick
        elif snap is None:
            phase = stage_pb2.REQUEST_PHASE_BLOCKED_ON_CREDIT if blocked else stage_pb2.REQUEST_PHASE_RUNNING
        else:
            slot, last = snap.slot, snap.last_tick
            phase = {
                "waiting": stage_pb2.REQUEST_PHASE_QUEUED,
                "prefill": stage_pb2.REQUEST_PHASE_PREFILL,
            }.get(snap.state, stage_pb2.REQUEST_PHASE_RUNNING)
            if blocked and phase == stage_pb2.REQUEST_PHASE_RUNNING:
                phase = stage_pb2.REQUEST_PHASE_BLOCKED_ON_CREDIT
        return stage_pb2.RequestState(
            request_id=self.request_id,
            phase=phase,
            slot=slot,
            frame_count=self.sent_frames + sum(t.pending_frames for t in self.takes),
            credit=self.credit,
            shm_slots_lent=self.loans.lent,
            last_tick=last,
        )
