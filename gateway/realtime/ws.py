"""The WebSocket face ``/v1/realtime``: a full-duplex session in OpenAI Realtime GA events.

The official ``openai`` client connects unchanged with ``base_url`` pointed at the gateway's HTTP port
(``client.realtime.connect(model=...)`` opens ``ws://HOST:PORT/v1/realtime?model=...``; the bearer token is
not checked). The session is admitted when the socket opens and ``session.created`` is the first event;
the model session starts at the first ``input_audio_buffer.append``, so ``session.update`` (persona, voice,
formats) is taken only before it. A bad event gets an ``error`` event and changes nothing; the connection
and every other session go on. When the session ends (idle timeout, time limit, a stage failure), the
client gets an ``error`` saying why, ``response.done``, and the socket is closed: 1000 after a clean end,
1013 (try again later) when capacity ran out, 1008 for a session this deployment cannot serve, 1011 for a
failure. A client that stops reading, so that a send waits ``gateway.duplex_send_timeout_s``, loses the
session at once (its slots are freed); it gets the ``error`` event (``session_send_timeout``) and close code
1008 only if it reads again within ``NOTIFY_GRACE_S``, else the connection is dropped (``duplex.send``).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import uuid
from typing import Any

import grpc
from fastapi import FastAPI, WebSocket
from pydantic import ValidationError
from starlette.websockets import WebSocketDisconnect

from gateway.checks import resolve_model
from gateway.core import GatewayCore
from gateway.duplex.send import SendStalled, bounded_send, count_stalled, stalled_in
from gateway.duplex.session import AgentAudio, DuplexSession, Ended, Notice
from gateway.duplex.settings import UNSUPPORTED, WS_FIELDS
from gateway.errors import GatewayError, invalid
from gateway.quotas import SESSION, http_client_of
from gateway.realtime.events import (
    DeltaText,
    InputAudioBufferAppendEvent,
    SessionUpdateEvent,
    error_json,
    response_json,
    session_json,
    settings_update,
)
from voxstage.duplex_audio import MAX_EVENT_BYTES, DuplexAudioError, decode_base64
from voxstage.quote import quoted

log = logging.getLogger(__name__)

CLOSE_NORMAL, CLOSE_POLICY, CLOSE_ERROR, CLOSE_TRY_LATER = 1000, 1008, 1011, 1013
# After a stalled send, how long the client gets to take the error event and the close frame.
NOTIFY_GRACE_S = 1.0
# What one read of a client's connection takes at most. asyncio reads 256 KiB at a time by default into a new
# buffer, shrunk to what came: glibc serves that size with mmap, mremap and munmap, which cost more CPU than
# the rest of parsing a 5 KB audio event (docs/benchmarks.md, "The gateway's WebSocket face per session").
# 64 KiB stays in the heap; the largest event (MAX_EVENT_BYTES) is read in 16 parts.
READ_CHUNK_BYTES = 64 * 1024
# How a cancelled reader or writer may end; a stall is handled from ``stalled_in`` before they are awaited.
_TASK_ENDINGS = (asyncio.CancelledError, WebSocketDisconnect, RuntimeError, SendStalled)
_NULL_ONLY = {
    "turn_detection": "the full-duplex model takes turns by itself; leave it null",
    "transcription": "user audio is not transcribed; leave it null",
    "noise_reduction": "not offered; leave it null",
    "tools": "tools are not supported; leave it empty",
    "tracing": "not offered; leave it null",
}


def close_code(end: Ended | GatewayError) -> int:
    err = end if isinstance(end, GatewayError) else end.error
    if (isinstance(end, Ended) and end.status != "failed") or err is None:
        return CLOSE_NORMAL
    if err.code in (grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.UNAVAILABLE):
        return CLOSE_TRY_LATER
    if err.code in (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.INVALID_ARGUMENT):
        return CLOSE_POLICY
    if err.code is grpc.StatusCode.NOT_FOUND:
        return CLOSE_POLICY
    return CLOSE_ERROR


def _validation_error(exc: ValidationError) -> GatewayError:
    first = exc.errors()[0]
    param = ".".join(str(p) for p in first["loc"])
    leaf = str(first["loc"][-1]) if first["loc"] else ""
    if leaf in _NULL_ONLY or (len(first["loc"]) > 1 and str(first["loc"][-2]) in _NULL_ONLY):
        key = leaf if leaf in _NULL_ONLY else str(first["loc"][-2])
        return invalid(param, _NULL_ONLY[key], reason="unsupported_parameter")
    if first["type"] == "extra_forbidden":
        return invalid(param, "unknown or unsupported parameter", reason="unknown_parameter")
    if first["type"] == "missing":
        return invalid(param, "required", reason="missing_field")
    return invalid(param, first["msg"], reason="invalid_value")


class RealtimeConnection:
    def __init__(self, ws: WebSocket, core: GatewayCore) -> None:
        self.ws = ws
        self.core = core
        self.session: DuplexSession | None = None
        self._send_lock = asyncio.Lock()
        self._ids = itertools.count(1)
        self._tag = uuid.uuid4().hex[:12]
        self._response: tuple[str, str] | None = None  # (response_id, item_id) once the agent speaks
        self._deltas: tuple[DeltaText, DeltaText] | None = None  # audio, transcript: the response's deltas
        self.send_timeout_s = core.config.gateway.duplex_send_timeout_s

    def _event_id(self) -> str:
        return f"event_{self._tag}_{next(self._ids)}"

    async def send(self, event: dict[str, Any]) -> None:
        event["event_id"] = self._event_id()
        await self._send_texts(json.dumps(event))

    async def _send_texts(self, *texts: str) -> None:
        """Every text in order, within one ``duplex_send_timeout_s``: a frame's audio and transcript deltas
        go out together."""
        await bounded_send(self._send(texts), self.send_timeout_s)

    async def _send(self, texts: tuple[str, ...]) -> None:
        # The lock wait counts against the limit too: behind a stalled send, this one is as stuck.
        async with self._send_lock:
            for text in texts:
                await self.ws.send_text(text)

    async def refuse(self, err: GatewayError, client_event_id: str | None = None) -> None:
        with contextlib.suppress(WebSocketDisconnect, RuntimeError):
            await self.send(error_json(err, client_event_id))
            await self.ws.close(close_code(err), err.reason)

    async def run(self) -> None:
        try:
            release = self.core.quotas.acquire(*http_client_of(self.ws.headers, self.ws.scope), SESSION)
        except GatewayError as err:
            await self.refuse(err)
            return
        try:
            await self._run()
        finally:
            release()

    async def _run(self) -> None:
        model = self.ws.query_params.get("model")
        try:
            if model:
                resolve_model(model, self.core.model, "model")
            self.session = self.core.sessions.admit()
        except GatewayError as err:
            await self.refuse(err)
            return
        session = self.session
        try:
            await self.send(
                {"type": "session.created", "session": session_json(session.id, session.settings)}
            )
            reader = asyncio.create_task(self._read())
            writer = asyncio.create_task(self._write(session))
            await asyncio.wait({reader, writer}, return_when=asyncio.FIRST_COMPLETED)
            stalled = stalled_in((reader, writer))
            for task in (reader, writer):
                task.cancel()
            for task in (reader, writer):
                with contextlib.suppress(*_TASK_ENDINGS):
                    await task
            if stalled is not None:
                await self._stalled(session, stalled)
        except SendStalled as exc:  # session.created itself could not be sent
            await self._stalled(session, exc)
        except (WebSocketDisconnect, RuntimeError):
            pass  # the client left while we wrote to it
        finally:
            await session.close()

    async def _stalled(self, session: DuplexSession, stalled: SendStalled) -> None:
        """Free the session first, then tell the client if its connection still takes anything."""
        await session.close()
        count_stalled(session.id, "/v1/realtime", self.send_timeout_s)
        event = error_json(stalled.error, None)
        event["event_id"] = self._event_id()
        try:
            async with asyncio.timeout(NOTIFY_GRACE_S):
                await self.ws.send_text(json.dumps(event))
                await self.ws.close(CLOSE_POLICY, stalled.error.reason)
        except TimeoutError:
            # The client still reads nothing: the connection is dropped now. Left to the server, its closing
            # handshake and keepalive pings held it open for another 40 s, which the client then saw as
            # 1006 with nothing said (issue 26).
            drop_connection(self.ws)
        except (WebSocketDisconnect, RuntimeError):
            pass

    # -- client -> gateway ------------------------------------------------------------------------------

    async def _read(self) -> None:
        while True:
            message = await self.ws.receive()
            if message["type"] == "websocket.disconnect":
                return
            text = message.get("text")
            event_id: str | None = None
            try:
                if text is None:
                    raise invalid("event", "binary frames are not accepted: send JSON text events",
                                  reason="invalid_event")  # fmt: skip
                if len(text) > MAX_EVENT_BYTES:
                    raise invalid(
                        "event",
                        f"{len(text)} bytes exceeds the limit of {MAX_EVENT_BYTES} bytes per event",
                        reason="event_too_large",
                    )
                try:
                    data = json.loads(text)
                except (ValueError, RecursionError):
                    raise invalid("event", "not valid JSON", reason="invalid_json") from None
                if not isinstance(data, dict) or not isinstance(data.get("type"), str):
                    raise invalid(
                        "type", "an event is a JSON object with a string type", reason="invalid_event"
                    )
                raw_id = data.get("event_id")
                event_id = raw_id if isinstance(raw_id, str) else None
                await self._dispatch(data)
            except GatewayError as err:
                await self.send(error_json(err, event_id))

    async def _dispatch(self, data: dict[str, Any]) -> None:
        session = self.session
        assert session is not None
        kind = data["type"]
        if kind == "input_audio_buffer.append":
            try:
                append = InputAudioBufferAppendEvent.model_validate(data)
            except ValidationError as exc:
                raise _validation_error(exc) from None
            try:
                audio = decode_base64(append.audio)
            except DuplexAudioError as exc:
                raise invalid("audio", str(exc), reason="invalid_audio") from None
            session.append(audio, "audio")
        elif kind == "session.update":
            try:
                update = SessionUpdateEvent.model_validate(data)
            except ValidationError as exc:
                raise _validation_error(exc) from None
            settings = session.update(settings_update(update.session), WS_FIELDS)
            await self.send({"type": "session.updated", "session": session_json(session.id, settings)})
        elif kind in UNSUPPORTED:
            raise invalid("type", f"{kind} is not supported: {UNSUPPORTED[kind]}", reason="unsupported_event")
        else:
            raise invalid("type", f"unknown client event {quoted(kind)}", reason="unknown_event")

    # -- gateway -> client ------------------------------------------------------------------------------

    async def _write(self, session: DuplexSession) -> None:
        async for event in session.events():
            if isinstance(event, AgentAudio):
                if self._deltas is None:
                    ids = (f"resp_{uuid.uuid4().hex[:20]}", f"item_{uuid.uuid4().hex[:20]}")
                    self._response = ids
                    self._deltas = (
                        DeltaText("response.output_audio.delta", ids),
                        DeltaText("response.output_audio_transcript.delta", ids),
                    )
                    response = response_json(ids[0], session.settings, "in_progress")
                    await self.send({"type": "response.created", "response": response})
                audio, transcript = self._deltas
                texts = [audio.base64(event.data, self._event_id())]
                if event.transcript:
                    texts.append(transcript.text(event.transcript, self._event_id()))
                await self._send_texts(*texts)
            elif isinstance(event, Notice):
                await self.send(error_json(event.error, None))
            else:
                await self._ended(session, event)
                return

    async def _ended(self, session: DuplexSession, end: Ended) -> None:
        if end.error is not None:
            await self.send(error_json(end.error, None))
        if self._response is not None:
            response = response_json(self._response[0], session.settings, end.status, end)
            await self.send({"type": "response.done", "response": response})
        await self.ws.close(close_code(end), (end.error.reason if end.error is not None else "session ended"))


def _transport(ws: WebSocket) -> Any:
    """The TCP connection under ``ws`` (None where the server is not uvicorn): uvicorn's WebSocket protocol
    owns the ``send`` that Starlette holds, and its ``transport`` is the connection. Starlette's exception
    middleware wraps that ``send`` in a closure of its own, so the bound method is looked for through the
    wrappers' closures too (by the owner alone, the lookup found nothing and the connection was never
    dropped)."""
    todo: list[Any] = [getattr(ws, "_send", None)]
    for _ in range(8):  # a few wrappers deep at most
        if not todo:
            break
        send = todo.pop(0)
        transport = getattr(getattr(send, "__self__", None), "transport", None)
        if transport is not None:
            return transport
        todo += [f for f in map(_cell_contents, getattr(send, "__closure__", None) or ()) if callable(f)]
    return None


def _cell_contents(cell: Any) -> Any:
    try:
        return cell.cell_contents
    except ValueError:  # a cell not yet filled
        return None


def drop_connection(ws: WebSocket) -> None:
    """Abort the connection under ``ws`` (no closing handshake)."""
    transport = _transport(ws)
    if transport is not None and hasattr(transport, "abort"):
        transport.abort()


def read_in_chunks(ws: WebSocket) -> None:
    """Reads of the connection under ``ws`` of at most ``READ_CHUNK_BYTES`` (asyncio's selector transports
    read ``max_size`` bytes a call)."""
    transport = _transport(ws)
    if transport is not None and getattr(transport, "max_size", 0) > READ_CHUNK_BYTES:
        transport.max_size = READ_CHUNK_BYTES


def register_realtime(app: FastAPI, core: GatewayCore) -> None:
    @app.websocket("/v1/realtime")
    async def realtime(websocket: WebSocket) -> None:
        offered = websocket.scope.get("subprotocols") or []
        # Browsers authenticate through subprotocols; the "realtime" one is echoed as OpenAI does.
        await websocket.accept(subprotocol="realtime" if "realtime" in offered else None)
        read_in_chunks(websocket)
        await RealtimeConnection(websocket, core).run()
