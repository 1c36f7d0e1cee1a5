"""The gRPC face of a full-duplex session: ``Speech.Converse`` on ``voxstage.v1`` messages.

The events are the OpenAI Realtime GA ones, one ``oneof`` arm each (speech.proto), and the session is the
very one ``/v1/realtime`` runs (``DuplexSession``): admitted when the call starts (``session_created``
first), settings fixed by the first ``input_audio_buffer_append``, client half-close closes it cleanly
(the buffered audio goes out, then the model's last audio, ``response_done`` and status OK).

What the client can fix without losing the session (a bad ``session_update``, an append in the wrong
format, an event a full-duplex session does not take) is answered in-band with a ``RealtimeError`` naming
the field, and the call goes on. What ends the session is a status: FAILED_PRECONDITION when the deployment
does not converse, RESOURCE_EXHAUSTED beyond ``duplex_session.max_sessions`` or the stages' capacity,
UNAVAILABLE, or the stage's failure. An idle timeout or the time limit ends it with a ``RealtimeError``
saying which, ``response_done`` (INCOMPLETE) and status OK. A client that stops reading, so that a write
waits ``gateway.duplex_send_timeout_s``, loses the session at once (its slots are freed) and gets
DEADLINE_EXCEEDED naming the key once it reads again (``gateway.duplex.send``).

Responses are written with ``context.write`` from two tasks (replies to client events, and the session's
audio) under one lock; the session's next frame is taken only once the previous one is written, which is
what returns its credit to the codec.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import uuid
from collections.abc import AsyncIterator
from typing import Any

import grpc
from google.protobuf import duration_pb2

from gateway.core import GatewayCore
from gateway.duplex.send import SendStalled, bounded_send, count_stalled, stalled_in
from gateway.duplex.session import AgentAudio, DuplexSession, Ended, Notice
from gateway.duplex.settings import GRPC_FIELDS, UNSUPPORTED, SessionSettings, SettingsUpdate
from gateway.errors import GatewayError, abort, as_gateway_error, invalid, openai_body
from gateway.quotas import SESSION, client_of
from voxstage import formats
from voxstage.duplex_audio import (
    FRAME_SECONDS,
    DuplexAudioError,
    DuplexFormat,
    check_format,
    format_of_encoding,
)
from voxstage.v1 import speech_pb2

Context = grpc.aio.ServicerContext[Any, Any]
_STATUS = {
    "completed": speech_pb2.RESPONSE_STATUS_COMPLETED,
    "incomplete": speech_pb2.RESPONSE_STATUS_INCOMPLETE,
    "failed": speech_pb2.RESPONSE_STATUS_FAILED,
    "cancelled": speech_pb2.RESPONSE_STATUS_CANCELLED,
}
# The Realtime names of the request arms a full-duplex session does not take (reasons in UNSUPPORTED).
_REALTIME_NAMES = {
    "input_audio_buffer_commit": "input_audio_buffer.commit",
    "response_create": "response.create",
    "response_cancel": "response.cancel",
    "conversation_item_truncate": "conversation.item.truncate",
}
_APPEND_FIELD = "input_audio_buffer_append.audio"
CLIENT_CLOSE_GRACE_S = 1.0  # after the session ended, how long to wait for the client's half-close


def _format(msg: speech_pb2.RealtimeAudioFormat, name: str) -> DuplexFormat:
    fmt = format_of_encoding(msg.encoding)
    if fmt is None:
        raise invalid(
            f"{name}.encoding",
            f"{formats.encoding_name(msg.encoding)} is not a Realtime format; use PCM_S16LE "
            "(24000 Hz), MULAW or ALAW (8000 Hz)",
            reason="unsupported_format",
        )
    try:
        return check_format(fmt, msg.sample_rate_hz)
    except DuplexAudioError as exc:
        raise invalid(f"{name}.sample_rate_hz", str(exc), reason="unsupported_format") from None


def settings_update(session: speech_pb2.Session) -> SettingsUpdate:
    """Set fields change the session; empty strings and absent messages keep what it has."""
    prefix = "session_update.session"
    update = SettingsUpdate(model=session.model or None, instructions=session.instructions or None)
    if session.HasField("audio"):
        audio = session.audio
        if audio.HasField("input"):
            if audio.input.HasField("format"):
                update.input_format = _format(audio.input.format, f"{prefix}.audio.input.format")
            kind = audio.input.turn_detection.type
            if kind not in (speech_pb2.TURN_DETECTION_TYPE_UNSPECIFIED, speech_pb2.TURN_DETECTION_TYPE_NONE):
                raise invalid(
                    f"{prefix}.audio.input.turn_detection.type",
                    "the full-duplex model takes turns by itself; use TURN_DETECTION_TYPE_NONE",
                    reason="unsupported_parameter",
                )
        if audio.HasField("output"):
            if audio.output.HasField("format"):
                update.output_format = _format(audio.output.format, f"{prefix}.audio.output.format")
            update.voice = audio.output.voice or None
    if session.HasField("seed"):
        update.seed = session.seed
    if session.HasField("sampling"):
        update.sampling = session.sampling
    if session.voice_audio:
        update.voice_audio = session.voice_audio
    return update


def _session_proto(session_id: str, s: SessionSettings) -> speech_pb2.Session:
    def fmt(f: DuplexFormat) -> speech_pb2.RealtimeAudioFormat:
        return speech_pb2.RealtimeAudioFormat(encoding=f.encoding, sample_rate_hz=f.sample_rate)

    msg = speech_pb2.Session(id=session_id, model=s.model, instructions=s.instructions)
    msg.audio.input.format.CopyFrom(fmt(s.input_format))
    msg.audio.input.turn_detection.type = speech_pb2.TURN_DETECTION_TYPE_NONE
    msg.audio.output.format.CopyFrom(fmt(s.output_format))
    msg.audio.output.voice = s.voice
    if s.seed is not None:
        msg.seed = s.seed
    msg.sampling.CopyFrom(s.sampling)
    return msg


def _error(err: GatewayError, event_id: str = "") -> speech_pb2.RealtimeError:
    body = openai_body(err)["error"]
    return speech_pb2.RealtimeError(
        type=body["type"], code=body["code"] or "", message=body["message"], param=body["param"] or "",
        event_id=event_id,
    )  # fmt: skip


class Conversation:
    def __init__(self, session: DuplexSession, context: Context, send_timeout_s: float) -> None:
        self.session = session
        self.context = context
        self.send_timeout_s = send_timeout_s
        self._lock = asyncio.Lock()
        self._ids = itertools.count(1)
        self._response_id = ""
        self._item_id = ""
        self._frames = 0
        self.ended = False

    async def write(self, **event: Any) -> None:
        await bounded_send(self._write(event), self.send_timeout_s)

    async def _write(self, event: dict[str, Any]) -> None:
        # The lock wait counts against the limit too: behind a stalled write, this one is as stuck.
        async with self._lock:
            await self.context.write(
                speech_pb2.ConverseResponse(event_id=f"event_{next(self._ids)}", **event)
            )

    async def read(self, requests: AsyncIterator[speech_pb2.ConverseRequest]) -> None:
        """Client events until half-close."""
        async for request in requests:
            if self.ended:
                continue  # the session is over; what is still in flight is dropped
            try:
                await self._handle(request)
            except GatewayError as err:
                await self.write(error=_error(err, request.event_id))

    async def _handle(self, request: speech_pb2.ConverseRequest) -> None:
        kind = request.WhichOneof("event")
        session = self.session
        if kind == "input_audio_buffer_append":
            session.append(request.input_audio_buffer_append.audio, _APPEND_FIELD)
        elif kind == "session_update":
            update = settings_update(request.session_update.session)
            settings = session.update(update, GRPC_FIELDS)
            await self.write(
                session_updated=speech_pb2.SessionUpdated(session=_session_proto(session.id, settings))
            )
        elif kind in _REALTIME_NAMES:
            name = _REALTIME_NAMES[kind]
            raise invalid(kind, f"{name} is not supported: {UNSUPPORTED[name]}", reason="unsupported_event")
        else:
            raise invalid("event", "an empty ConverseRequest: set one event", reason="invalid_event")

    async def pump(self) -> Ended:
        """The session's events to the client; returns the end."""
        session = self.session
        async for event in session.events():
            if isinstance(event, AgentAudio):
                if not self._response_id:
                    self._response_id = f"resp_{uuid.uuid4().hex[:20]}"
                    self._item_id = f"item_{uuid.uuid4().hex[:20]}"
                    response = speech_pb2.Response(
                        id=self._response_id, status=speech_pb2.RESPONSE_STATUS_IN_PROGRESS
                    )
                    await self.write(response_created=speech_pb2.ResponseCreated(response=response))
                ids = {"response_id": self._response_id, "item_id": self._item_id}
                await self.write(
                    response_output_audio_delta=speech_pb2.ResponseOutputAudioDelta(**ids, delta=event.data)
                )
                self._frames += 1
                if event.transcript:
                    delta = speech_pb2.ResponseOutputAudioTranscriptDelta(**ids, delta=event.transcript)
                    await self.write(response_output_audio_transcript_delta=delta)
            elif isinstance(event, Notice):
                await self.write(error=_error(event.error))
            else:
                assert isinstance(event, Ended)
                if event.error is not None and event.status != "failed":
                    await self.write(error=_error(event.error))
                if self._response_id:
                    await self.write(response_done=speech_pb2.ResponseDone(response=self._done(event)))
                return event
        raise AssertionError("the session's events end with Ended")

    def _done(self, end: Ended) -> speech_pb2.Response:
        seconds = self._frames * FRAME_SECONDS
        return speech_pb2.Response(
            id=self._response_id,
            status=_STATUS[end.status],
            status_reason=end.error.reason if end.error is not None else "",
            audio_duration=duration_pb2.Duration(seconds=int(seconds), nanos=int(seconds % 1 * 1e9)),
        )


async def converse(
    core: GatewayCore, requests: AsyncIterator[speech_pb2.ConverseRequest], context: Context
) -> None:
    try:
        release = core.quotas.acquire(*client_of(context), SESSION)
    except GatewayError as err:
        await abort(context, err)
        return
    try:
        await _converse(core, requests, context)
    finally:
        release()


async def _converse(
    core: GatewayCore, requests: AsyncIterator[speech_pb2.ConverseRequest], context: Context
) -> None:
    try:
        session = core.sessions.admit()
    except GatewayError as err:
        await abort(context, err)
        return
    conv = Conversation(session, context, core.config.gateway.duplex_send_timeout_s)
    tasks: list[asyncio.Task[Any]] = []
    end: Ended | None = None
    stalled: SendStalled | None = None
    try:
        await conv.write(
            session_created=speech_pb2.SessionCreated(session=_session_proto(session.id, session.settings))
        )
        reader = asyncio.create_task(conv.read(requests))
        pump = asyncio.create_task(conv.pump())
        tasks = [reader, pump]
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        stalled = stalled_in(tasks)
        if stalled is not None:
            raise stalled
        if reader.done() and not reader.cancelled() and reader.exception() is not None:
            # Not a half-close: handling a client event failed (a bad message, or a bug). The session ends
            # with that status; before issue 26 any such failure read as a half-close and ended with OK.
            failure = as_gateway_error(reader.exception())  # type: ignore[arg-type]
            end = Ended("failed", failure)
            await session.close()
            await conv.write(error=_error(failure))
            conv.ended = True
        elif reader.done() and not pump.done():
            # Half-close: a clean end once the buffered audio is out. A client that cancels reads the same
            # at first (grpc.aio ends its request stream, then cancels this handler); close() below then
            # cancels the codec stream if it has not ended.
            session.finish()
        if end is None:
            end = await pump
        conv.ended = True
        if not reader.done():
            # The server ended the session while the client still streams. Returning now would race its
            # next write, and grpc.aio then reports INTERNAL to the client instead of this call's status
            # (grpc/grpc#36066); a client that half-closes on response.done (the SDK does) gets it cleanly.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(reader), CLIENT_CLOSE_GRACE_S)
    except SendStalled as exc:
        stalled = exc
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await session.close()
    if stalled is not None:
        # The slots are free already; the status waits in the transport behind the unread audio.
        count_stalled(session.id, "Converse", conv.send_timeout_s)
        await abort(context, stalled.error)
        return
    assert end is not None
    if end.status == "failed" and end.error is not None:
        await abort(context, end.error)
