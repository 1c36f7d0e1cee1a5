"""A duplex session's ``Codec.Stream`` (``STREAM_MODE_DUPLEX``) as the gateway speaks it (protocol.md §11).

The TTS client (``CodecStream``) already owns what both modes share: the writer and reader tasks, the
terminal fence, shared-memory reads and acks, the agent-audio grant, ``cancel`` with its one-tick grace and
the transport errors. Duplex adds the other direction and its own clocks:

* the codec's ``opened`` grants SAMPLES of user audio, and its later ``credit`` messages re-grant them as
  frames are encoded; the gateway sends one 80 ms ``user_audio`` frame per message, only within that grant;
* every ``pcm`` message is one agent frame with its transcript delta and the user frame it answers;
* the first-chunk clock starts at ``open`` (§8: a duplex session owes audio from the start), and after the
  first audio the stall clock always runs while the gateway holds a frame's worth of agent credit, because
  a live session owes one frame every tick.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import numpy as np

from gateway.routing import Replica, ReplicaPool
from gateway.upstream import CodecStream, Event, Pcm, Timeouts
from voxstage import metrics
from voxstage.duplex import FRAME_SAMPLES, FRAME_SECONDS
from voxstage.internal.v1 import stage_pb2
from voxstage.transport.shm_reader import ShmReader


@dataclass
class AgentPcm(Pcm):
    """One agent frame: the PCM plus what travels with it."""

    transcript: str = ""
    user_frame: int = -1  # the gateway's user frame this audio answers; -1: silence fill or the prompt
    first_frame: int = 0

    def to_float(self) -> np.ndarray:
        if self.format == stage_pb2.PCM_FORMAT_S16LE:
            return np.frombuffer(self.data, dtype="<i2").astype(np.float32) / 32768.0
        return np.frombuffer(self.data, dtype="<f4").astype(np.float32, copy=False)


class DuplexCodecStream(CodecStream):
    def __init__(
        self,
        pool: ReplicaPool,
        replica: Replica,
        *,
        timeouts: Timeouts,
        shm_reader: ShmReader | None = None,
        tick_s: float = FRAME_SECONDS,
    ) -> None:
        # No deadline: a session lives until it is closed; the gateway enforces its time limit itself.
        super().__init__(
            pool, replica, timeouts=timeouts, deadline_s=None, shm_reader=shm_reader, tick_s=tick_s
        )
        self.user_credit = 0  # SAMPLES of user audio the codec will take now
        self.credit_changed = asyncio.Event()
        self.frames_sent = 0

    async def open_duplex(self, msg: stage_pb2.StreamOpen) -> stage_pb2.StreamOpened:
        self._work_since = time.monotonic()
        opened = await self.open(msg, min_chunk_samples=FRAME_SAMPLES)
        credit = opened.initial_credit
        if credit.unit != stage_pb2.CREDIT_UNIT_SAMPLES:
            await self.cancel("protocol error")
            raise self._protocol_error("opened.initial_credit must grant SAMPLES of user audio")
        self.user_credit = credit.amount
        return opened

    def _timeout(self) -> tuple[float | None, str]:
        if not self._got_data:
            assert self._work_since is not None
            return self._work_since + self.timeouts.first_chunk_s - time.monotonic(), "first-chunk"
        if self._credit_left >= FRAME_SAMPLES:
            return self.timeouts.stall_s, "stall"
        return None, ""  # the client is not taking audio: the codec is waiting on us

    async def send_user_frame(self, frame: np.ndarray) -> None:
        """One 80 ms frame (float32, 24 kHz); the caller checks ``user_credit`` first."""
        self.user_credit -= FRAME_SAMPLES
        msg = stage_pb2.CodecStreamRequest()
        chunk = msg.user_audio  # filled in place: a nested message given to a constructor is copied whole
        chunk.sample_offset = self.frames_sent * FRAME_SAMPLES
        chunk.sample_count = FRAME_SAMPLES
        chunk.format = stage_pb2.PCM_FORMAT_F32LE
        chunk.data.inline = np.ascontiguousarray(frame, dtype="<f4").tobytes()
        chunk.sent_unix_ns = time.time_ns()
        self.frames_sent += 1
        await self._write(msg)

    async def next_event(self) -> Event:
        """The next agent frame (``AgentPcm``) or the terminal; credits and acks are taken on the way."""
        while True:
            msg = await self._receive(None, "")
            kind = msg.WhichOneof("response")
            if kind == "pcm":
                metrics.observe_hop("codec", "gateway", msg.pcm.sent_unix_ns)
                chunk = msg.pcm
                base = self._pcm(chunk)
                return AgentPcm(
                    base.data,
                    base.format,
                    base.sample_count,
                    base.sample_offset,
                    base.segment_index,
                    transcript=chunk.transcript_delta,
                    user_frame=chunk.user_frame,
                    first_frame=chunk.first_frame,
                )
            if kind == "credit":
                if msg.credit.unit != stage_pb2.CREDIT_UNIT_SAMPLES:
                    raise self._protocol_error("user-audio credit must be in SAMPLES")
                self.user_credit += msg.credit.amount
                self.credit_changed.set()
                continue
            if kind == "end_of_stream":
                self.terminal = msg.end_of_stream
                return msg.end_of_stream
            if kind in ("shm_ack", "segment_done"):
                continue  # the gateway lends no shared memory; a duplex stream has no segments
            raise self._protocol_error(f"unexpected {kind} after opened")
