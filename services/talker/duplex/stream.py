"""One duplex Talker.Stream (docs/protocol.md §11): user codes in, one agent frame per step out.

Lives on the event loop and never runs model code. ``open`` builds the session (voice, persona, sampling)
and admits it (sessions never queue: no free slot is RESOURCE_EXHAUSTED); each ``user_codes`` goes to the
engine's input queue within the credit granted in ``opened``, re-granted as steps consume frames; each
step's agent frame leaves as one ``CodecFrames`` (codes, text token, transcript, the consumed user frame).
Agent output is real-time and is not held back by a missing grant beyond one window: a codec that stops
granting fails the session with RESOURCE_EXHAUSTED.
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np

from services.talker.duplex.engine import DuplexOutput, Finish
from services.talker.duplex.worker import DuplexWorker
from services.talker.request_params import request_params
from services.talker.stream import TalkerStageStream
from services.talker.worker import RequestSnapshot
from voxstage import wire
from voxstage.internal.v1 import stage_pb2
from voxstage.stage.errors import StageFailure
from voxstage.transport.payload import read_payload
from voxstage.transport.shm_layout import InvalidShmReference

if TYPE_CHECKING:
    from services.talker.servicer import TalkerServicer

AGENT_WINDOW = 25  # agent frames queued beyond the codec's grant before the session fails
_keys = itertools.count(1)
# Fields of text-to-speech streams: a duplex open that sets one is refused, naming it.
TTS_ONLY = ("language", "non_streaming_mode", "chunk_schedule")


class DuplexTalkerStream(TalkerStageStream):
    refused = {kind: "duplex streams carry user codes, not text" for kind in ("text", "flush")}

    def __init__(self, servicer: TalkerServicer) -> None:
        super().__init__(f"td{next(_keys)}")
        self.servicer = servicer
        self.worker: DuplexWorker = servicer.worker
        self.credit = 0
        self.unsent: deque[stage_pb2.TalkerStreamResponse] = deque()  # frames
        self.sent_frames = 0
        self.user_frames = 0
        self.submitted = False
        self.finish: Finish | None = None
        self.finished_tick = 0

    # -- codec -> talker ---------------------------------------------------------------------------------
    def _input_now(self, kind: str, msg: stage_pb2.TalkerStreamRequest) -> bool:
        if kind != "user_codes":
            return False
        self._user_codes(msg.user_codes)
        return True

    async def _input(self, kind: str, msg: stage_pb2.TalkerStreamRequest) -> bool:
        if kind == "end_of_input":
            if self.end_of_input:
                raise StageFailure("INVALID_ARGUMENT", "end_of_input: received twice")
            self.end_of_input = True
            self.worker.close(self.key)
        else:
            return False
        return True

    def _cancel(self, cancel: stage_pb2.Cancel) -> None:
        if self.finish is None:
            self.worker.cancel(self.key)  # CANCELLED output -> terminal

    async def _open(self, op: stage_pb2.StreamOpen) -> None:
        srv = self.servicer
        self._admit(op, srv, model=srv.model, family=srv.family, duplex=True)
        for name in TTS_ONLY:
            if op.HasField(name) if name == "chunk_schedule" else getattr(op, name):
                raise StageFailure("INVALID_ARGUMENT", f"{name}: not used by duplex streams")
        if op.initial_credit.unit != stage_pb2.CREDIT_UNIT_FRAMES or op.initial_credit.amount < 1:
            raise StageFailure("INVALID_ARGUMENT", "initial_credit: need at least 1 FRAME of agent output")
        self.credit = op.initial_credit.amount
        params = request_params(op, srv.voices)
        self.worker.check_voice(params)
        request = self.worker.build_request(self.key, params)
        await self.worker.open(request, self)
        self.submitted = True
        self._lend_shm(srv.shm_writer, op)
        # The talker reads no shared memory (user codes are a few bytes): it never offers to.
        hello = self._hello(srv.shm_writer, stage_pb2.StreamOpen())
        grant = stage_pb2.Credit(unit=stage_pb2.CREDIT_UNIT_FRAMES, amount=self.worker.engine.cfg.input_queue)
        self._send_opened(op, srv, initial_credit=grant, transport=hello)

    def _user_codes(self, frames: stage_pb2.CodecFrames) -> None:
        if self.end_of_input:
            raise StageFailure("INVALID_ARGUMENT", "user_codes: received after end_of_input")
        groups = self.servicer.num_groups
        if frames.num_groups != groups:
            raise StageFailure("INVALID_ARGUMENT", f"user_codes.num_groups: must be {groups}")
        if frames.first_frame != self.user_frames:
            raise StageFailure(
                "INVALID_ARGUMENT",
                f"user_codes.first_frame: expected {self.user_frames}, got {frames.first_frame}",
            )
        try:
            data = read_payload(frames.codes, None)[0]
        except InvalidShmReference as exc:
            raise StageFailure("INVALID_ARGUMENT", f"user_codes.codes: {exc}") from exc
        codes = wire.codes_from_bytes(
            data,
            frames.frame_count,
            groups,
            field="user_codes.codes",
            codebook_size=self.worker.engine.adapter.codebook_size,
        )
        self.user_frames += frames.frame_count
        if self.finish is None:
            self.worker.push_user(self.key, int(frames.first_frame), codes)

    # -- engine -> codec -----------------------------------------------------------------------------------
    def on_output(self, out: DuplexOutput) -> None:
        if out.finish is not None:
            self.finish = out.finish
            self.finished_tick = self.worker.engine.ticks
        else:
            msg = stage_pb2.TalkerStreamResponse()
            frames = msg.frames  # filled in place: a nested message given to a constructor is copied whole
            frames.first_frame = out.frame
            frames.frame_count = 1
            frames.num_groups = len(out.tokens) - 1
            self.loans.payload(wire.codes_to_bytes(out.tokens[None, 1:]), into=frames.codes)
            frames.text_tokens = np.asarray(out.tokens[:1], "<i4").tobytes()
            if out.transcript:
                frames.transcript_delta = out.transcript
            frames.user_frame = out.user_frame
            self.unsent.append(msg)
        if out.consumed and not self.terminal_sent:
            grant = stage_pb2.Credit(unit=stage_pb2.CREDIT_UNIT_FRAMES, amount=out.consumed)
            self.outbox.put_nowait(stage_pb2.TalkerStreamResponse(credit=grant))
        self.pump()

    def on_session_error(self, code: str, message: str) -> None:
        self.fail(code, message)

    def on_request_failed(self, message: str) -> None:
        self.on_session_error("INTERNAL", message)

    def on_engine_failed(self, message: str) -> None:
        self.finish = Finish.CANCELLED
        self.fail("INTERNAL", f"talker engine failed: {message}")

    def pump(self) -> None:
        if self.terminal_sent:
            return
        while self.unsent and self.credit > 0:
            msg = self.unsent.popleft()
            msg.frames.sent_unix_ns = time.time_ns()
            self.outbox.put_nowait(msg)
            self.credit -= 1
            self.sent_frames += 1
            if self.t_first is None:
                self.t_first = time.perf_counter()
        if len(self.unsent) > AGENT_WINDOW:
            self.fail(
                "RESOURCE_EXHAUSTED", f"agent frames not read: {len(self.unsent)} frames wait for credit"
            )
            return
        if self.finish is not None and not self.unsent:
            reason = (
                stage_pb2.END_REASON_EOS if self.finish is Finish.CLOSED else stage_pb2.END_REASON_CANCELLED
            )
            self._terminal(reason)

    # -- termination ------------------------------------------------------------------------------------
    def fail(self, code: str, message: str) -> None:
        if self.terminal_sent:
            return
        self._terminal(stage_pb2.END_REASON_ERROR, wire.stream_error(code, message, "talker"))
        if self.submitted and self.finish is None:
            self.worker.cancel(self.key)

    def _terminal(self, reason: int, error: stage_pb2.StreamError | None = None) -> None:
        if self.terminal_sent:
            return
        self.unsent.clear()
        admitted = self.worker.admitted_at(self.key)
        queued = None if admitted is None else admitted - self.t_open
        self._send_terminal(reason, error, frames=self.sent_frames, queued=queued)

    def close(self) -> None:
        if self.submitted and self.finish is None:
            self.worker.cancel(self.key)
        self.worker.forget(self.key)
        self.loans.close()

    def state(self, snapshot: Mapping[str, RequestSnapshot], tick: int) -> stage_pb2.RequestState:
        snap = snapshot.get(self.key)
        slot, last = -1, self.finished_tick
        if self.terminal_sent:
            phase = stage_pb2.REQUEST_PHASE_FINISHED
        elif snap is None:
            phase = stage_pb2.REQUEST_PHASE_RUNNING
        else:
            slot, last = snap.slot, snap.last_tick
            phase = (
                stage_pb2.REQUEST_PHASE_PREFILL
                if snap.state == "prefill"
                else stage_pb2.REQUEST_PHASE_RUNNING
            )
        return stage_pb2.RequestState(
            request_id=self.request_id,
            phase=phase,
            slot=slot,
            frame_count=self.sent_frames,
            credit=self.credit,
            shm_slots_lent=self.loans.lent,
            last_tick=last,
        )
