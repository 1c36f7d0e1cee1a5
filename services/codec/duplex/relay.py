"""The codec's side of one duplex Talker.Stream (docs/protocol.md §11), on top of ``TalkerRelay``.

What the text-to-speech relay already does holds here too: open and refusal, agent-frame credit (the codec
grants a frame as its PCM leaves for the gateway), shared-memory reads and acks, first-frame and stall
timeouts, peer death (UNAVAILABLE, channel dropped, shm reaped) and cancellation. Added: user codes to the
talker within the user-code credit it grants (held briefly when it has none, never dropped silently), each
agent frame passed on with its text token, transcript and consumed user frame, and end of input.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from typing import TYPE_CHECKING

import numpy as np

from services.codec.duplex.types import AgentFrame
from services.codec.relay import TalkerRelay
from voxstage import wire
from voxstage.internal.v1 import stage_pb2 as S
from voxstage.stage.errors import StageFailure

if TYPE_CHECKING:
    from services.codec.duplex.stream import DuplexCodecStream
    from services.codec.upstream import TalkerPool

# User frames (one per tick) held for a talker that grants no user-code credit before the session fails: a
# talker that stopped consuming for 2 s is not coming back in time for a conversation.
HELD_USER_FRAMES = 25


class DuplexTalkerRelay(TalkerRelay):
    stream: DuplexCodecStream  # type: ignore[assignment]

    def __init__(
        self, stream: DuplexCodecStream, pool: TalkerPool, address: str, timeout: float | None
    ) -> None:
        super().__init__(stream, pool, address, timeout)  # type: ignore[arg-type]
        self.num_groups: int = stream.rt.num_groups
        self.user_credit = 0
        self.user_sent = 0
        self.held: deque[S.TalkerStreamRequest] = deque()  # user_codes

    async def open(self, msg: S.StreamOpen) -> S.StreamOpened:
        opened = await super().open(msg)
        if self.direct:
            self.call.take = self.take
        credit = opened.initial_credit
        if credit.unit != S.CREDIT_UNIT_FRAMES or credit.amount < 1:
            raise StageFailure(
                "FAILED_PRECONDITION",
                f"talker {self.address} opened a duplex session without user-code credit "
                f"({credit.amount} in unit {S.CreditUnit.Name(credit.unit)})",
            )
        self.user_credit = credit.amount
        # Duplex starts the first-frame clock at open: the talker has its prompt to work on (§8).
        self._first = asyncio.get_running_loop().call_later(self.first_timeout, self._expired, "first")
        return opened

    # -- codec -> talker -------------------------------------------------------------------------------
    def send_user_codes(self, index: int, codes: np.ndarray) -> None:
        """User frame ``index`` (the engine numbers them 0, 1, ... per session, one per tick)."""
        if self.done or self.eoi_sent:
            return
        msg = S.TalkerStreamRequest()
        frames = msg.user_codes  # filled in place: a nested message given to a constructor is copied whole
        frames.first_frame = index
        frames.frame_count = 1
        frames.num_groups = self.num_groups
        # 16 bytes: always inline (the talker reads no shared memory).
        frames.codes.inline = wire.codes_to_bytes(codes.reshape(1, -1))
        self.held.append(msg)
        self._flush()
        if len(self.held) > HELD_USER_FRAMES:
            self.stream.fail(
                "RESOURCE_EXHAUSTED",
                f"talker {self.address} consumes no user codes: {len(self.held)} frames wait for its credit",
            )

    def end_input(self) -> None:
        if self.done or self.eoi_sent:
            return
        self.held.clear()  # the talker leaves at its next tick: frames it has not got would go unread
        self._send(S.TalkerStreamRequest(end_of_input=S.EndOfInput()))
        self.eoi_sent = True
        self._rearm_stall()

    def _flush(self) -> None:
        while self.held and self.user_credit > 0 and not self.done:
            msg = self.held.popleft()
            msg.user_codes.sent_unix_ns = time.time_ns()
            self._send(msg)
            self.user_credit -= 1
            self.user_sent += 1

    # -- talker -> codec -------------------------------------------------------------------------------
    def take(self, resp: S.TalkerStreamResponse) -> bool:
        """On a link, an agent frame or a credit handled as it arrives: the link asks only while the reader
        waits on an empty inbox, so the order is the reader's, without a turn of the event loop per frame.
        False: the reader takes it."""
        kind = resp.WhichOneof("response")
        if kind == "credit":
            handle = self._on_other
        elif kind == "frames":
            handle = self._frames_of
        else:
            return False
        if self.done:
            return True  # the reader stopped at a failure: what follows is dropped unread, as there
        try:
            handle(resp)
        except Exception as exc:  # noqa: BLE001 - a protocol error or a bug fails this request, as in the reader
            self._mishandled(exc)
        return True

    def _frames_of(self, resp: S.TalkerStreamResponse) -> None:
        self._frames(resp.frames)

    def _deliver(self, f: S.CodecFrames, codes: np.ndarray) -> None:
        where = f"talker {self.address}"
        if f.frame_count != 1 or codes.shape[1] != self.num_groups:
            raise StageFailure(
                "INVALID_ARGUMENT",
                f"{where}: duplex frames carry one frame of {self.num_groups} groups, got "
                f"{f.frame_count} x {codes.shape[1]}",
            )
        if len(f.text_tokens) != 4:
            raise StageFailure("INVALID_ARGUMENT", f"{where}: frames.text_tokens must hold one int32")
        if not -1 <= f.user_frame < self.user_sent:
            raise StageFailure(
                "INVALID_ARGUMENT",
                f"{where}: frames.user_frame {f.user_frame} names no user frame sent ({self.user_sent} sent)",
            )
        token = int(np.frombuffer(f.text_tokens, "<i4")[0])
        self.stream.agent_frame(AgentFrame(f.first_frame, codes[0], token, f.transcript_delta, f.user_frame))

    async def _segment_done(self, done: S.SegmentDone) -> None:
        """A session is one take: its only segment_done arrives with the terminal."""

    def _on_other(self, resp: S.TalkerStreamResponse) -> None:
        kind = resp.WhichOneof("response")
        if kind == "credit":
            if resp.credit.unit != S.CREDIT_UNIT_FRAMES:
                raise StageFailure(
                    "INVALID_ARGUMENT", f"talker {self.address}: credit.unit: user codes count FRAMES"
                )
            self.user_credit += resp.credit.amount
            self._flush()
            self._rearm_stall()
        elif kind == "shm_ack":
            raise StageFailure(
                "INVALID_ARGUMENT", f"talker {self.address}: shm_ack for shared memory the codec never lent"
            )

    # -- timeouts ------------------------------------------------------------------------------------------
    def _rearm_stall(self) -> None:
        if self._stall is not None:
            self._stall.cancel()
            self._stall = None
        # The talker owes a frame per tick once it has spoken (before that the first-frame clock runs),
        # while it holds agent credit; every message from it restarts the clock.
        if not self.done and self.received and self.outstanding > 0:
            self._stall = asyncio.get_running_loop().call_later(self.stall_timeout, self._expired, "stall")
