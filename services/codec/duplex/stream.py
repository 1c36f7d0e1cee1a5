"""One duplex Codec.Stream (docs/protocol.md §11): user audio in, agent PCM and transcript out.

Lives on the event loop and runs no model code. ``open`` is validated, a voice recording becomes Mimi codes
(on the engine thread), the session takes a codec slot, the talker's duplex stream is opened with the
forwarded request, and our ``opened`` (with the jitter buffer as user-audio credit) follows the talker's.
Then the engine's clock drives everything: each tick's user codes go to the talker (``DuplexTalkerRelay``)
and free jitter-buffer credit for the gateway; each agent frame comes back as one ``pcm`` message. Output is
real time: at most one initial window of agent audio waits for the gateway's credit, beyond it the session
fails. The talker's terminal is relayed after the last PCM.
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import grpc
import numpy as np

from services.codec.duplex.open import check_open, talker_open
from services.codec.duplex.relay import DuplexTalkerRelay
from services.codec.duplex.types import AgentAudio, AgentFrame, DuplexOutput, UserCodes
from services.codec.stream import CodecStageStream
from voxstage import wire
from voxstage.audio import StreamingResampler
from voxstage.duplex import regrant_at
from voxstage.internal.v1 import stage_pb2 as S
from voxstage.stage.errors import StageFailure
from voxstage.transport.payload import ack_message, read_payload
from voxstage.transport.shm_layout import InvalidShmReference, ShmError, StaleShmReference

if TYPE_CHECKING:
    from services.codec.duplex.worker import DuplexCodecWorker
    from services.codec.servicer import CodecServicer
    from voxstage.transport.shm_reader import ShmReader

_keys = itertools.count(1)


@dataclass
class _Piece:
    pcm: np.ndarray  # float32 at the output rate
    out: AgentAudio


class DuplexCodecStream(CodecStageStream):
    refused = {kind: "duplex sessions carry user audio, not text" for kind in ("text", "flush")}

    def __init__(self, servicer: CodecServicer, context: grpc.aio.ServicerContext) -> None:
        super().__init__(f"cd{next(_keys)}")
        self.srv = servicer
        self.worker: DuplexCodecWorker = servicer.worker  # type: ignore[assignment]
        self.rt = self.worker.runtime
        self.context = context
        self.joined = False  # holds an engine session (a slot and both Mimi states)
        self.fmt = S.PCM_FORMAT_S16LE
        self.rate = self.rt.sample_rate
        self.resampler: StreamingResampler | None = None
        self.pcm_credit = 0
        self.window = 0  # the gateway's initial window: the most agent audio that may wait for credit
        self.pieces: deque[_Piece] = deque()
        self.queued = 0  # samples in ``pieces``
        self.user_credit = 0  # user-audio samples granted to the gateway and not yet received
        self.credit_owed = 0  # jitter-buffer samples freed and not granted back yet
        self.grant_at = regrant_at(self.worker.engine.cfg.jitter_samples)  # the least owed that goes back
        self.user_received = 0
        self.reader: ShmReader | None = None  # set when the gateway may send user audio through shm
        self.decoded = 0  # agent frames the engine decoded for us
        self.frames_sent = 0
        self.samples_sent = 0
        self.talker_eos: S.EndOfStream | None = None
        self.relay: DuplexTalkerRelay | None = None

    # -- gateway -> codec ----------------------------------------------------------------------------------
    def _input_now(self, kind: str, msg: S.CodecStreamRequest) -> bool:
        if kind != "user_audio":
            return False
        self._user_audio(msg.user_audio)
        return True

    async def _input(self, kind: str, msg: S.CodecStreamRequest) -> bool:
        if kind == "end_of_input":
            if self.end_of_input:
                raise StageFailure("INVALID_ARGUMENT", "end_of_input: received twice")
            self.end_of_input = True
            if self.joined:
                self.worker.end_input(self.key)
            assert self.relay is not None  # set by a successful open
            self.relay.end_input()
        else:
            return False
        return True

    async def _open(self, op: S.StreamOpen) -> None:
        srv, rt = self.srv, self.rt
        self._admit(op, srv, model=rt.model, family=rt.family, duplex=True)
        params = check_open(
            op, native_rate=rt.sample_rate, samples_per_frame=rt.samples_per_frame, num_groups=rt.num_groups
        )
        await srv.pool.check(op.talker_address)  # --allowed-talkers: refused before a session slot is taken
        self.fmt, self.rate = params.pcm_format, params.sample_rate
        if self.rate != rt.sample_rate:
            self.resampler = StreamingResampler(rt.sample_rate, self.rate)
        self.pcm_credit = self.window = params.window
        # Marked before the await: if this handler is cancelled meanwhile, close() must free the slot.
        self.joined = True
        try:
            await self.worker.join(self.key, self)
        except StageFailure:
            self.joined = False
            raise
        codes = params.codes
        if params.recording is not None:
            codes = await self.worker.reference_codes(params.recording, params.recording_rate)
        writer = srv.shm_writer
        self._lend_shm(writer, op)
        # User audio may come through shm only if this codec reads shm and can open the gateway's regions.
        hello = self._hello(writer, op if srv.pool.reader is not None else S.StreamOpen())
        if hello.verified_peer_probe:
            self.reader = srv.pool.reader
        self.relay = DuplexTalkerRelay(self, srv.pool, op.talker_address, self.context.time_remaining())
        if not await self._open_talker(talker_open(op, codes), op.talker_address, rt.num_groups):
            return
        self.worker.start_session(self.key)
        self.user_credit = self.worker.engine.cfg.jitter_samples
        grant = S.Credit(unit=S.CREDIT_UNIT_SAMPLES, amount=self.user_credit)
        fmt = {"pcm_format": self.fmt, "sample_rate_hz": self.rate, "channels": 1}
        self._send_opened(op, rt, **fmt, initial_credit=grant, transport=hello)

    def _user_audio(self, chunk: S.PcmChunk) -> None:
        if self.end_of_input:
            raise StageFailure("INVALID_ARGUMENT", "user_audio: received after end_of_input")
        if chunk.format not in (S.PCM_FORMAT_S16LE, S.PCM_FORMAT_F32LE):
            raise StageFailure("INVALID_ARGUMENT", "user_audio.format: must be PCM_FORMAT_S16LE or F32LE")
        if chunk.sample_offset != self.user_received:
            raise StageFailure(
                "INVALID_ARGUMENT",
                f"user_audio.sample_offset: expected {self.user_received}, got {chunk.sample_offset}",
            )
        try:
            data, ref = read_payload(chunk.data, self.reader)
        except StaleShmReference as exc:
            raise StageFailure("DATA_LOSS", f"user_audio.data: {exc}") from exc
        except (InvalidShmReference, ShmError) as exc:
            raise StageFailure("INVALID_ARGUMENT", f"user_audio.data: {exc}") from exc
        if ref is not None:
            self.outbox.put_nowait(S.CodecStreamResponse(shm_ack=ack_message([ref])))
        pcm = wire.pcm_from_bytes(data, chunk.format, field="user_audio.data")
        n = pcm.size
        if n != chunk.sample_count:
            raise StageFailure(
                "INVALID_ARGUMENT", f"user_audio.sample_count: says {chunk.sample_count}, data holds {n}"
            )
        if n > self.user_credit:
            raise StageFailure(
                "INVALID_ARGUMENT", f"user_audio: {n} samples exceed the granted credit of {self.user_credit}"
            )
        if not np.isfinite(pcm).all():
            raise StageFailure("INVALID_ARGUMENT", "user_audio.data: contains NaN or infinite samples")
        self.user_credit -= n
        self.user_received += n
        if n and self.joined:
            self.worker.push_audio(self.key, pcm, int(chunk.sample_offset))

    # -- engine -> gateway / talker ----------------------------------------------------------------------
    def on_output(self, out: DuplexOutput) -> None:
        if self.terminal_sent:
            return
        if isinstance(out, UserCodes):
            if out.freed_samples and not self.end_of_input:
                # A quarter of the jitter buffer at a time (every 4th tick at the seeds' 1 s).
                self.credit_owed += out.freed_samples
                if self.credit_owed >= self.grant_at:
                    self.user_credit += self.credit_owed
                    msg = S.CodecStreamResponse()
                    msg.credit.unit = S.CREDIT_UNIT_SAMPLES
                    msg.credit.amount = self.credit_owed
                    self.credit_owed = 0
                    self.outbox.put_nowait(msg)
            if self.relay is not None:
                self.relay.send_user_codes(out.index, out.codes)
            return
        self.decoded += 1
        pcm = out.pcm if self.resampler is None else self.resampler.process(out.pcm)
        self.pieces.append(_Piece(pcm, out))
        self.queued += pcm.size
        self.pump()

    def on_session_error(self, code: str, message: str) -> None:
        self.joined = False  # the engine already left the session
        self.fail(code, message)

    def on_request_failed(self, message: str) -> None:
        self.on_session_error("INTERNAL", message)

    def on_engine_failed(self, message: str) -> None:
        self.joined = False
        self.fail("INTERNAL", f"codec engine failed: {message}")

    def pump(self) -> None:
        while self.pieces and not self.terminal_sent and self.pieces[0].pcm.size <= self.pcm_credit:
            self._send_pcm(self.pieces.popleft())
        if self.terminal_sent:
            return
        if self.queued > self.window:
            self.fail(
                "RESOURCE_EXHAUSTED",
                f"agent audio not read: {self.queued} samples wait for credit (window {self.window})",
            )
            return
        relay = self.relay
        if self.talker_eos is not None and not self.pieces and relay is not None:
            if self.decoded >= relay.received:
                self._release()
                self._terminal(self.talker_eos.reason)

    def _send_pcm(self, piece: _Piece) -> None:
        n, out = piece.pcm.size, piece.out
        msg = S.CodecStreamResponse()
        chunk = msg.pcm  # filled in place: a nested message given to a constructor is copied whole
        chunk.sample_offset = self.samples_sent
        chunk.sample_count = n
        chunk.format = self.fmt
        self.loans.payload(wire.pcm_to_bytes(piece.pcm, self.fmt), into=chunk.data)
        chunk.first_frame = out.frame
        chunk.frame_count = 1
        if out.transcript:
            chunk.transcript_delta = out.transcript
        chunk.sent_unix_ns = time.time_ns()
        chunk.user_frame = out.user_frame
        self.outbox.put_nowait(msg)
        self.pcm_credit -= n
        self.queued -= n
        self.samples_sent += n
        self.frames_sent += 1
        if self.t_first is None:
            self.t_first = time.perf_counter()
        if self.relay is not None:
            self.relay.grant(1)  # that frame's audio left the codec: the talker may send another

    # -- called by the relay -------------------------------------------------------------------------------
    def agent_frame(self, frame: AgentFrame) -> None:
        if self.joined and not self.terminal_sent:
            self.worker.push_agent(self.key, frame)

    async def _talker_done(self, eos: S.EndOfStream) -> None:
        self.talker_eos = eos
        self.pump()

    # -- termination -------------------------------------------------------------------------------------
    def _release(self) -> None:
        if self.joined:
            self.joined = False
            self.worker.leave(self.key)

    # -- status --------------------------------------------------------------------------------------------
    def state(self, view: Mapping[str, Any], tick: int) -> S.RequestState:
        slots: Mapping[str, int] = getattr(view, "slots", {})
        if self.terminal_sent:
            phase = S.REQUEST_PHASE_FINISHED
        elif self.pieces:
            phase = S.REQUEST_PHASE_BLOCKED_ON_CREDIT
        elif self.opened:
            phase = S.REQUEST_PHASE_RUNNING
        else:
            phase = S.REQUEST_PHASE_QUEUED
        return S.RequestState(
            request_id=self.request_id,
            phase=phase,
            slot=slots.get(self.key, -1) if self.joined else -1,
            frame_count=self.frames_sent,
            credit=self.pcm_credit,
            shm_slots_lent=self.loans.lent,
            last_tick=tick,
        )
