"""One full-duplex session at the gateway, whichever face carries it (docs/protocol.md §11).

The face feeds client events in (``update``, ``append``, ``finish``) and writes ``events()`` out; the
session owns everything between: the input pipeline (decode, resample to 24 kHz, 80 ms frames, the 2 s
buffer beyond the codec's grant), the one ``Codec.Stream`` on a codec and talker picked for the session's
whole life, the output conversion, and the clocks (idle timeout, time limit).

Settings are fixed by the first audio: the model session (the codec stream, the talker slot and its
prompt of voice and persona) starts then. Agent credit goes back to the codec as frames are handed to the
client (the code after ``yield`` in ``events``, a quarter of the window at a time), so a client that stops
reading stops the grants and the codec fails the session after one window instead of buffering without end.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import grpc
import numpy as np

from gateway.duplex.settings import DuplexFields, SessionSettings, SettingsUpdate, apply_update
from gateway.duplex.upstream import AgentPcm, DuplexCodecStream
from gateway.errors import GatewayError, invalid
from gateway.routing import Replica, open_on_pair
from gateway.upstream import Timeouts
from gateway.voices.store import encoded_reference
from voxstage import metrics
from voxstage.duplex_audio import (
    AGENT_GRANT_SAMPLES,
    AGENT_WINDOW_SAMPLES,
    FRAME_SAMPLES,
    FRAME_SECONDS,
    INPUT_BUFFER_FRAMES,
    INPUT_BUFFER_SECONDS,
    DuplexAudioError,
    Framer,
    InputDecoder,
    OutputEncoder,
)
from voxstage.internal.v1 import stage_pb2
from voxstage.transport.host import local_hello
from voxstage.transport.payload import hello_to_proto

if TYPE_CHECKING:
    from gateway.duplex.sessions import SessionManager

CLOSE_GRACE_S = 5.0  # a clean close waits this long for the codec's terminal before cancelling
MAX_TRACKED_FRAMES = 512  # user frames awaiting their answer, for the response-latency histogram


@dataclass(frozen=True)
class SessionLimits:
    idle_timeout_s: float
    max_duration_s: float
    timeouts: Timeouts
    max_text_chars: int
    first_audio_samples: int = 0  # agent audio gathered before the first goes out (duplex_session)


@dataclass(frozen=True)
class AgentAudio:
    data: bytes  # in the session's output format
    transcript: str
    samples: int  # 24 kHz samples: the credit this frame returns
    user_frame: int


@dataclass(frozen=True)
class Notice:
    """Something the client should know; the session goes on."""

    error: GatewayError


@dataclass(frozen=True)
class Ended:
    """The last event. ``status`` is the Realtime response status (completed, incomplete, failed)."""

    status: str
    error: GatewayError | None


SessionEvent = AgentAudio | Notice | Ended


def _closing_error(reason: str, message: str) -> GatewayError:
    return GatewayError(grpc.StatusCode.DEADLINE_EXCEEDED, message, reason=reason)


class DuplexSession:
    def __init__(self, manager: SessionManager, settings: SessionSettings) -> None:
        self.manager = manager
        self.limits: SessionLimits = manager.limits
        self.id = f"sess_{uuid.uuid4().hex[:24]}"
        self.settings = settings
        self.created_at = self.last_audio = time.monotonic()
        self.started = False  # audio arrived: settings are fixed and the model session starts
        self._decoder: InputDecoder | None = None
        self._framer = Framer()
        self._pending: deque[tuple[np.ndarray, float]] = deque()
        self._dropping = False
        self._wake = asyncio.Event()
        self._out: asyncio.Queue[SessionEvent] = asyncio.Queue()
        self._stream: DuplexCodecStream | None = None
        self._replicas: tuple[Replica, Replica] | None = None
        self._closing: tuple[str, GatewayError | None] | None = None
        self._ended = False
        self._closed = False
        self._arrivals: dict[int, float] = {}
        self._runner: asyncio.Task[None] | None = None
        self._grace: asyncio.Task[None] | None = None
        self._watchdog = asyncio.create_task(self._watch())

    # -- client -> session ------------------------------------------------------------------------------

    def update(self, update: SettingsUpdate, names: DuplexFields) -> SessionSettings:
        if self.started:
            raise GatewayError(
                grpc.StatusCode.FAILED_PRECONDITION,
                "the session's settings are fixed once audio has started (the model session was built "
                "with them); send session.update before the first input_audio_buffer.append",
                field="session",
                reason="session_already_started",
            )
        self.settings = apply_update(
            self.settings,
            update,
            self.manager.model,
            names,
            max_text_chars=self.limits.max_text_chars,
            voice_aliases=self.manager.config.gateway.voice_aliases,
            voices=self.manager.voices,
        )
        return self.settings

    def append(self, data: bytes, field_name: str) -> None:
        """Take one chunk of client audio; a bad chunk raises and changes nothing."""
        if self._ended or self._closing is not None:
            raise GatewayError(
                grpc.StatusCode.FAILED_PRECONDITION,
                "the session is closing; no more audio is taken",
                field=field_name,
                reason="session_closing",
            )
        if self._decoder is None:
            self._decoder = InputDecoder(self.settings.input_format)
        try:
            pcm = self._decoder.decode(data)
        except DuplexAudioError as exc:
            raise invalid(field_name, str(exc), reason="invalid_audio") from None
        now = self.last_audio = time.monotonic()
        for frame in self._framer.push(pcm):
            self._pending.append((frame, now))
        self._trim(field_name)
        if not self.started:
            self.started = True
            self._runner = asyncio.create_task(self._run())
        self._wake.set()

    def _trim(self, field_name: str) -> None:
        """Keep at most the 2 s buffer of frames waiting for the codec's grant; drop the oldest beyond."""
        dropped = 0
        while len(self._pending) > INPUT_BUFFER_FRAMES:
            self._pending.popleft()
            dropped += 1
        if not dropped:
            self._dropping = False
            return
        metrics.DUPLEX_DROPPED_INPUT.inc(dropped * FRAME_SECONDS)
        if not self._dropping:  # once per episode: the client learns, the events do not flood
            self._dropping = True
            self._out.put_nowait(
                Notice(
                    GatewayError(
                        grpc.StatusCode.RESOURCE_EXHAUSTED,
                        f"user audio arrives faster than the model takes it: more than "
                        f"{INPUT_BUFFER_SECONDS:g} s is waiting, so the oldest audio is dropped; "
                        "send audio in real time",
                        field=field_name,
                        reason="input_audio_dropped",
                    )
                )
            )

    def finish(self, status: str = "completed", error: GatewayError | None = None) -> None:
        """Close cleanly: what is buffered goes out, then ``end_of_input``; ``Ended`` follows the terminal."""
        if self._ended or self._closing is not None:
            return
        self._closing = (status, error)
        if self._watchdog is not asyncio.current_task():
            self._watchdog.cancel()
        if not self.started:
            self._end(status, error)
            return
        held = self._framer.held_samples
        if held:  # the last partial frame is padded with silence rather than lost
            for frame in self._framer.push(np.zeros(FRAME_SAMPLES - held, np.float32)):
                self._pending.append((frame, time.monotonic()))
        self._wake.set()
        self._grace = asyncio.create_task(self._close_grace(status, error))

    # -- session -> client ------------------------------------------------------------------------------

    async def events(self) -> AsyncIterator[SessionEvent]:
        owed = 0  # agent samples handed to the client and not granted back yet
        while True:
            event = await self._out.get()
            yield event
            if isinstance(event, Ended):
                return
            if isinstance(event, AgentAudio):
                self._answered(event.user_frame)
                stream = self._stream
                owed += event.samples
                # A quarter of the window at a time (every 7th frame), not a credit message per frame.
                if stream is not None and stream.terminal is None and owed >= AGENT_GRANT_SAMPLES:
                    await stream.grant(owed)
                    owed = 0

    def _answered(self, user_frame: int) -> None:
        if user_frame < 0:
            return
        arrived = self._arrivals.pop(user_frame, None)
        if arrived is not None:
            metrics.DUPLEX_RESPONSE_LATENCY.observe(time.monotonic() - arrived)
        for index in [i for i in self._arrivals if i < user_frame]:
            del self._arrivals[index]  # answered out of order, or dropped by the talker: never answered

    def _end(self, status: str, error: GatewayError | None) -> None:
        if not self._ended:
            self._ended = True
            self._out.put_nowait(Ended(status, error))

    # -- the model session ------------------------------------------------------------------------------

    def _open_msg(self, codec: Replica, talker: Replica) -> stage_pb2.StreamOpen:
        s = self.settings
        msg = stage_pb2.StreamOpen(
            request_id=self.id,
            mode=stage_pb2.STREAM_MODE_DUPLEX,
            talker_address=talker.address,
            model=talker.status.model if talker.status is not None else s.model,
            voice="" if s.uploaded is not None else s.voice,
            instructions=s.instructions,
            pcm_format=stage_pb2.PCM_FORMAT_F32LE,
            sample_rate_hz=0,  # 24 kHz; the output format is made here, next to the client
            initial_credit=stage_pb2.Credit(unit=stage_pb2.CREDIT_UNIT_SAMPLES, amount=AGENT_WINDOW_SAMPLES),
        )
        if s.sampling.ListFields():
            msg.sampling.CopyFrom(s.sampling)
        if s.seed is not None:
            msg.seed = s.seed
        if s.uploaded is not None:
            msg.reference.CopyFrom(encoded_reference(s.uploaded))
        if s.voice_audio is not None:
            pcm, rate = s.voice_audio
            msg.reference.audio.inline = np.ascontiguousarray(pcm, "<f4").tobytes()
            msg.reference.audio_format = stage_pb2.PCM_FORMAT_F32LE
            msg.reference.audio_sample_rate_hz = rate
        msg.transport.CopyFrom(hello_to_proto(local_hello()))
        return msg

    async def _open(self) -> DuplexCodecStream:
        manager = self.manager

        async def attempt(codec: Replica, talker: Replica) -> DuplexCodecStream:
            rate = codec.status.frame_rate_hz if codec.status is not None else 0.0
            stream = DuplexCodecStream(
                manager.codecs,
                codec,
                timeouts=self.limits.timeouts,
                shm_reader=manager.shm_reader,
                tick_s=1.0 / rate if rate > 0 else FRAME_SECONDS,
            )
            try:
                await stream.open_duplex(self._open_msg(codec, talker))
            except BaseException:
                stream.close()
                raise
            return stream

        try:
            codec, talker, stream = await open_on_pair(manager.codecs, manager.talkers, attempt)
        except GatewayError as err:
            if err.code is grpc.StatusCode.RESOURCE_EXHAUSTED:
                manager.refuse("stage_capacity", err)
            elif err.code is grpc.StatusCode.UNAVAILABLE:
                manager.refuse("unavailable", err)
            raise
        self._replicas = (codec, talker)
        stream.credit_changed = self._wake
        self._stream = stream
        return stream

    async def _run(self) -> None:
        sender: asyncio.Task[None] | None = None
        gathering: list[AgentAudio] = []
        try:
            t0 = time.monotonic()
            stream = await self._open()
            opened = time.monotonic()
            metrics.DUPLEX_JOIN.labels(phase="open").observe(opened - t0)
            encoder = OutputEncoder(self.settings.output_format)
            sender = asyncio.create_task(self._send(stream))
            while True:
                event = await stream.next_event()
                if isinstance(event, AgentPcm):
                    data = encoder.encode(event.to_float())
                    gathering.append(AgentAudio(data, event.transcript, event.sample_count, event.user_frame))
                    if opened and sum(a.samples for a in gathering) < self.limits.first_audio_samples:
                        continue  # the first audio goes out once there is enough of it to play with slack
                    if opened:
                        metrics.DUPLEX_JOIN.labels(phase="first_audio").observe(time.monotonic() - opened)
                        opened = 0.0
                    self._flush(gathering)
                    continue
                assert isinstance(event, stage_pb2.EndOfStream)
                if event.reason not in (stage_pb2.END_REASON_EOS, stage_pb2.END_REASON_MAX_FRAMES):
                    raise stream.error_of(event)
                status, error = self._closing or ("completed", None)
                self._flush(gathering)
                self._end(status, error)
                return
        except GatewayError as err:
            self._flush(gathering)
            self._end("failed", err)
        except Exception as exc:  # a bug ends this session only, with its cause
            self._flush(gathering)
            self._end("failed", GatewayError(grpc.StatusCode.INTERNAL, f"internal error: {exc!r}"))
        finally:
            if sender is not None:
                sender.cancel()

    def _flush(self, gathering: list[AgentAudio]) -> None:
        """The agent audio gathered for the first audio (or the one frame since) to the client, in order."""
        for audio in gathering:
            self._out.put_nowait(audio)
        gathering.clear()

    async def _send(self, stream: DuplexCodecStream) -> None:
        """User frames to the codec within its grant; ``end_of_input`` once a clean close has flushed."""
        while True:
            while self._pending and stream.user_credit >= FRAME_SAMPLES:
                frame, arrived = self._pending.popleft()
                self._arrivals[stream.frames_sent] = arrived
                if len(self._arrivals) > MAX_TRACKED_FRAMES:
                    del self._arrivals[min(self._arrivals)]
                await stream.send_user_frame(frame)
            if self._closing is not None and not self._pending:
                await stream.end_of_input(owes_segment=False)
                return
            self._wake.clear()
            await self._wake.wait()

    async def _watch(self) -> None:
        """Idle timeout and time limit: both close the session cleanly and tell the client why."""
        limits = self.limits
        while not self._ended and self._closing is None:
            now = time.monotonic()
            idle_at = self.last_audio + limits.idle_timeout_s
            limit_at = self.created_at + limits.max_duration_s
            if now >= limit_at:
                self.finish(
                    "incomplete",
                    _closing_error(
                        "session_expired",
                        f"the session reached its time limit of {limits.max_duration_s:g} s "
                        "(gateway.duplex_max_session_s)",
                    ),
                )
            elif now >= idle_at:
                self.finish(
                    "incomplete",
                    _closing_error(
                        "session_idle_timeout",
                        f"no audio from the client for {limits.idle_timeout_s:g} s "
                        "(gateway.duplex_idle_timeout_s)",
                    ),
                )
            else:
                await asyncio.sleep(min(idle_at, limit_at) - now)

    async def _close_grace(self, status: str, error: GatewayError | None) -> None:
        await asyncio.sleep(CLOSE_GRACE_S)
        if not self._ended:
            if self._stream is not None and self._stream.terminal is None:
                await self._stream.cancel("close timed out")
            self._end(status, error)

    # -- teardown ---------------------------------------------------------------------------------------

    async def close(self) -> None:
        """Free everything; the face calls it once, in ``finally``. A session that has not ended (the
        client vanished) is cancelled on the codec at once, which frees the talker slot within a tick."""
        if self._closed:
            return
        self._closed = True
        for task in (self._watchdog, self._grace, self._runner):
            if task is not None:
                task.cancel()
        try:
            if self._runner is not None:
                with contextlib.suppress(asyncio.CancelledError):
                    await self._runner
            stream = self._stream
            if stream is not None:
                if stream.terminal is None:
                    await asyncio.shield(stream.cancel("client gone"))
                else:
                    stream.close()
        finally:
            # Even when this cleanup is itself cancelled, the slot counts must come back.
            if self._replicas is not None:
                for replica in self._replicas:
                    replica.in_flight -= 1
            self.manager.release(self)
