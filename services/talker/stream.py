"""One Talker.Stream: protocol state between the codec's messages and one engine request.

Lives on the event loop and never runs model code: it decodes the codec's messages, posts commands to the
``TalkerWorker`` and turns the request's ``TalkerOutput`` into batched ``CodecFrames`` that respect the
codec's frame credit (docs/protocol.md §2-§6). Text is buffered until the first ``flush`` or
``end_of_input``: a request whose whole text is known at that point runs with the model's default
(non-streaming) prompt, one that flushes first runs in streaming-text mode and receives later deltas.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from voxstage import wire
from voxstage.chunking import whole_chunks
from voxstage.internal.v1 import stage_pb2
from voxstage.stage_errors import StageFailure
from voxstage.stage_stream import StageStream
from voxstage.talker.engine import Finish, TalkerOutput
from voxstage.talker.request_params import request_params
from voxstage.talker.worker import RequestParams, RequestSnapshot

if TYPE_CHECKING:
    from voxstage.talker.servicer import TalkerServicer

MAX_TEXT_CHARS = 1 << 16  # the gateway enforces the user-facing limit; this only bounds a buggy peer
_REASONS = {
    Finish.EOS: stage_pb2.END_REASON_EOS,
    Finish.MAX_FRAMES: stage_pb2.END_REASON_MAX_FRAMES,
    Finish.MAX_MODEL_LEN: stage_pb2.END_REASON_MAX_FRAMES,
    Finish.CANCELLED: stage_pb2.END_REASON_CANCELLED,
}
_keys = itertools.count(1)


def sendable(
    sent: int, avail: int, credit: int, initial: int, steady: int, finished: bool, ramp: bool = True
) -> int:
    """Frames to put in the next CodecFrames: whole chunks of the schedule that fit the credit, or the
    whole remainder once generation has finished (never split to fit: the codec's window holds a chunk)."""
    if finished and avail <= credit:
        return avail
    return whole_chunks(sent, min(avail, credit), initial, steady, ramp)


class TalkerStream(StageStream):
    role = "talker"
    peer = "codec"
    outbox: asyncio.Queue[stage_pb2.TalkerStreamResponse]

    def __init__(self, servicer: TalkerServicer) -> None:
        super().__init__(f"ts{next(_keys)}")
        self.servicer = servicer
        self.worker = servicer.worker
        self.params = RequestParams()
        self.non_streaming = False
        self.initial = self.steady = 1
        self.ramp = True
        self.credit = 0
        self.sent_frames = 0
        self.pending: list[np.ndarray] = []
        self.pending_frames = 0
        self.finish: Finish | None = None
        self.engine_error: str | None = None
        self.text: list[str] = []
        self.text_chars = 0
        self.submitted = False
        self.finished_tick = 0

    # -- codec -> talker ------------------------------------------------------------------------------------
    async def _handle(self, msg: stage_pb2.TalkerStreamRequest) -> None:
        kind = msg.WhichOneof("request")
        if not self.opened:
            if kind != "open":
                raise StageFailure("INVALID_ARGUMENT", f"first message must be open, got {kind}")
            await self._open(msg.open)
        elif kind == "open":
            raise StageFailure("INVALID_ARGUMENT", "open: sent twice on one stream")
        elif kind == "text":
            await self._text(msg.text)
        elif kind == "flush":
            self._no_input_after_end("flush")
            if not self.submitted and not self.non_streaming:
                await self._submit(complete=False)
        elif kind == "end_of_input":
            self._no_input_after_end("end_of_input")
            self.end_of_input = True
            if not self.submitted:
                await self._submit(complete=True)
            elif self.finish is None:
                await self._push("", complete=True)
        elif kind == "credit":
            if msg.credit.unit != stage_pb2.CREDIT_UNIT_FRAMES:
                raise StageFailure("INVALID_ARGUMENT", "credit.unit: the talker stream counts FRAMES")
            self.credit += msg.credit.amount
            self.pump()
        elif kind == "shm_ack":
            self.loans.ack(msg.shm_ack)
        elif kind == "cancel":
            self.cancel_requested = True
            self.loans.forfeit()
            if self.submitted and self.finish is None:
                self.worker.cancel(self.key)  # CANCELLED output -> terminal
            else:
                self._terminal(stage_pb2.END_REASON_CANCELLED)
        elif kind == "user_codes":
            raise StageFailure("FAILED_PRECONDITION", "user_codes: only duplex streams carry user codes")
        else:
            raise StageFailure("INVALID_ARGUMENT", f"unknown request {kind!r}")

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
        self.params = request_params(op)
        self.non_streaming = op.non_streaming_mode
        self.worker.check_voice(self.params)
        self.worker.build_request(self.key, self.params, "", False)  # validates sampling and seed now
        writer = srv.shm_writer
        self._lend_shm(writer, op)
        self.opened = True
        self.outbox.put_nowait(
            stage_pb2.TalkerStreamResponse(
                opened=stage_pb2.StreamOpened(
                    request_id=op.request_id,
                    model=srv.model,
                    family=srv.family,
                    num_code_groups=srv.num_groups,
                    frame_rate_hz=srv.frame_rate_hz,
                    chunk_schedule=sched,
                    transport=self._hello(writer, op),
                )
            )
        )

    async def _text(self, text: str) -> None:
        self._no_input_after_end("text")
        self.text_chars += len(text)
        if self.text_chars > MAX_TEXT_CHARS:
            raise StageFailure(
                "INVALID_ARGUMENT", f"text: more than {MAX_TEXT_CHARS} characters in one request"
            )
        if not self.submitted:
            self.text.append(text)
        elif self.finish is None and text:
            await self._push(text, complete=False)

    async def _submit(self, *, complete: bool) -> None:
        request = self.worker.build_request(self.key, self.params, "".join(self.text), complete)
        self.text.clear()
        self.submitted = True
        await self.worker.submit(request, self)

    async def _push(self, text: str, *, complete: bool) -> None:
        try:
            await self.worker.push_text(self.key, text, complete)
        except StageFailure as exc:
            if exc.code == "FAILED_PRECONDITION" or self.finish is not None:
                return  # generation already ended (EOS or frame budget) while text was in flight
            raise

    # -- engine -> codec --------------------------------------------------------------------------------
    def on_output(self, out: TalkerOutput) -> None:
        if out.codes.shape[0]:
            self.pending.append(out.codes)
            self.pending_frames += out.codes.shape[0]
        if out.finish is not None:
            self.finish = out.finish
            self.engine_error = out.error
            self.finished_tick = self.worker.engine.ticks
        self.pump()

    def on_engine_failed(self, message: str) -> None:
        self.finish = Finish.ERROR
        self.fail("INTERNAL", f"talker engine failed: {message}")

    def pump(self) -> None:
        if self.terminal_sent:
            return
        if self.finish is Finish.CANCELLED:
            self._terminal(stage_pb2.END_REASON_CANCELLED)
            return
        if self.finish is Finish.ERROR:
            self.fail("INTERNAL", self.engine_error or "talker engine error")
            return
        done = self.finish is not None
        while n := sendable(
            self.sent_frames, self.pending_frames, self.credit, self.initial, self.steady, done, self.ramp
        ):
            self._send_frames(n)
        if done and not self.pending_frames:
            self.outbox.put_nowait(
                stage_pb2.TalkerStreamResponse(
                    segment_done=stage_pb2.SegmentDone(segment_index=0, frame_count=self.sent_frames)
                )
            )
            assert self.finish is not None
            self._terminal(_REASONS[self.finish])

    def _send_frames(self, n: int) -> None:
        buf = np.concatenate(self.pending) if len(self.pending) > 1 else self.pending[0]
        chunk, rest = buf[:n], buf[n:]
        self.pending = [rest] if rest.shape[0] else []
        self.pending_frames -= n
        self.outbox.put_nowait(
            stage_pb2.TalkerStreamResponse(
                frames=stage_pb2.CodecFrames(
                    first_frame=self.sent_frames,
                    frame_count=n,
                    num_groups=chunk.shape[1],
                    codes=self.loans.payload(wire.codes_to_bytes(chunk)),
                    segment_index=0,
                    sent_unix_ns=time.time_ns(),
                )
            )
        )
        self.credit -= n
        self.sent_frames += n
        if self.t_first is None:
            self.t_first = time.perf_counter()

    # -- termination ------------------------------------------------------------------------------------
    def fail(self, code: str, message: str) -> None:
        """End the stream with an in-band error and free the engine slot (the terminal is queued first)."""
        if self.terminal_sent:
            return
        self._terminal(stage_pb2.END_REASON_ERROR, wire.stream_error(code, message, "talker"))
        if self.submitted and self.finish is None:
            self.worker.cancel(self.key)

    def _terminal(self, reason: int, error: stage_pb2.StreamError | None = None) -> None:
        if self.terminal_sent:
            return
        self.pending, self.pending_frames = [], 0
        admitted = self.worker.admitted_at(self.key)
        queued = None if admitted is None else admitted - self.t_open
        self._send_terminal(reason, error, frames=self.sent_frames, queued=queued)

    def _response(self, **fields: Any) -> stage_pb2.TalkerStreamResponse:
        return stage_pb2.TalkerStreamResponse(**fields)

    def close(self) -> None:
        """The handler is returning (terminal written, or the call is dead): free everything."""
        if self.submitted and self.finish is None:
            self.worker.cancel(self.key)
        self.worker.forget(self.key)
        self.loans.close()

    # -- status ---------------------------------------------------------------------------------------------
    def state(self, snapshot: Mapping[str, RequestSnapshot], tick: int) -> stage_pb2.RequestState:
        snap = snapshot.get(self.key)
        blocked = self.pending_frames and not sendable(
            self.sent_frames,
            self.pending_frames,
            self.credit,
            self.initial,
            self.steady,
            self.finish is not None,
        )
        slot, last = -1, self.finished_tick
        if self.terminal_sent:
            phase = stage_pb2.REQUEST_PHASE_FINISHED
        elif not self.submitted:
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
            frame_count=self.sent_frames + self.pending_frames,
            credit=self.credit,
            shm_slots_lent=self.loans.lent,
            last_tick=last,
        )
