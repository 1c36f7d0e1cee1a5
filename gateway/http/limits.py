"""The HTTP face's limits on clients that hold a connection or a request without moving it along.

uvicorn bounds none of these by itself (docs/configuration.md, ``gateway.http_*``):

- a request head must arrive within ``http_header_timeout_s`` and fit ``http_max_header_bytes``
  (``GuardedH11``, the h11 protocol uvicorn runs for the gateway);
- a request body may not stall longer than ``http_body_timeout_s``, a response write the client does not
  take may not wait longer than ``stream_idle_timeout_s``, and no request runs longer than
  ``max_stream_lifetime_s`` (``HttpTimeouts``, ASGI middleware): a streamed response that nobody reads would
  otherwise hold its admission slot and codec stream forever, as an idle gRPC stream would;
- an idle keep-alive connection closes after ``http_keep_alive_timeout_s`` (uvicorn's own setting).
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import grpc
import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.server import ServerState

from gateway.errors import GatewayError, openai_body
from gateway.message_limits import ws_max_frame_bytes
from voxstage.config import GatewayConfig

log = logging.getLogger(__name__)

Scope = dict[str, Any]
Message = dict[str, Any]


class _HttpConfig(uvicorn.Config):
    """uvicorn's config plus the header timeout ``GuardedH11`` reads: uvicorn has no such setting."""

    def __init__(self, app: Any, *, header_timeout_s: float, **kwargs: Any) -> None:
        super().__init__(app, **kwargs)
        self.header_timeout_s = header_timeout_s


def _reject(transport: asyncio.BaseTransport, status: int, phrase: str, text: str) -> None:
    """Answer and close. Raw bytes, not h11: its state machine has no response for a request it never
    parsed, and the connection is closed right after anyway."""
    body = text.encode()
    head = (
        f"HTTP/1.1 {status} {phrase}\r\ncontent-type: text/plain; charset=utf-8\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    )
    assert isinstance(transport, asyncio.WriteTransport)
    transport.write(head.encode() + body)
    transport.close()


class GuardedH11(H11Protocol):
    """uvicorn's h11 protocol with a header timeout and a request-head size limit answered with 431.

    uvicorn arms no timer before a connection's first response completes, and its keep-alive timer is
    cancelled by any byte: a connection that sends nothing, or half a request head, is held until the client
    leaves. Here a request's head must be complete within ``header_timeout_s`` of the connection opening, or
    of the first byte of a later request on a kept-alive connection; otherwise it gets 408 and is closed.

    h11's ``max_incomplete_event_size`` only limits a head still *incomplete* after a read (and uvicorn
    answers that 400): a whole oversized head arriving in one read passes. So the head's bytes are counted
    here, up to its blank line, before h11 sees them.
    """

    def __init__(self, config: uvicorn.Config, server_state: ServerState, app_state: dict[str, Any],
                 _loop: asyncio.AbstractEventLoop | None = None) -> None:  # fmt: skip
        super().__init__(config, server_state, app_state, _loop)
        self._header_timeout_s: float | None = getattr(config, "header_timeout_s", None)
        self._max_head = config.h11_max_incomplete_event_size
        self._header_timer: asyncio.TimerHandle | None = None
        self._head_bytes = 0  # bytes of the current request head seen so far
        self._head_tail = b""  # its last 3 bytes, to find a blank line split across reads

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        if self.conn.their_state is h11.IDLE:
            if self._header_timer is None:
                self._arm()  # the first byte of a next request on a kept-alive connection
            if self._head_too_large(data):
                self._disarm()
                self._reject_large_head()
                return
        super().data_received(data)
        if self.conn.their_state is not h11.IDLE:
            self._disarm()  # the head is complete (or refused, or the connection was upgraded)
            self._head_bytes, self._head_tail = 0, b""

    def _head_too_large(self, data: bytes) -> bool:
        if self._max_head is None:
            return False
        window = self._head_tail + data
        end = window.find(b"\r\n\r\n")
        if end >= 0:
            return self._head_bytes + end + 4 - len(self._head_tail) > self._max_head
        self._head_bytes += len(data)
        self._head_tail = window[-3:]
        return self._head_bytes > self._max_head

    def _reject_large_head(self) -> None:
        _reject(self.transport, 431, "Request Header Fields Too Large",
                f"request head over {self._max_head} bytes (gateway.http_max_header_bytes)")  # fmt: skip

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def send_400_response(self, msg: str) -> None:
        # h11 refuses a head over its buffer limit as a protocol error, which uvicorn answers 400.
        if self._max_head is not None and len(self.conn.trailing_data[0]) > self._max_head:
            self._reject_large_head()
            return
        super().send_400_response(msg)

    def _arm(self) -> None:
        if self._header_timeout_s is not None:
            self._disarm()
            self._header_timer = self.loop.call_later(self._header_timeout_s, self._header_timed_out)

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _header_timed_out(self) -> None:
        self._header_timer = None
        if not self.transport.is_closing() and self.conn.their_state is h11.IDLE:
            _reject(self.transport, 408, "Request Timeout",
                    f"request head not complete within {self._header_timeout_s:g} s "
                    "(gateway.http_header_timeout_s)")  # fmt: skip


DISCONNECT: Message = {"type": "http.disconnect"}
# After the client is treated as gone, the app has this long to notice before it is cancelled outright.
GONE_GRACE_S = 2.0


class HttpTimeouts:
    """ASGI middleware: the HTTP face's request timeouts that uvicorn lacks.

    - **Body** (``body_timeout_s``): a request body that stalls that long ends the request with 408. A
      client that declared a Content-Length and sent less held its request until it left. The wrapped
      ``receive`` raises a GatewayError with HTTP status 408, which the speech handler answers like any
      request error (no other route reads a body), marked ``connection: close``: the rest of the body will
      never be read, so the connection cannot be reused.
    - **Send** (``send_timeout_s``, ``gateway.stream_idle_timeout_s``): a response write the client does not
      take for that long (a streamed response nobody reads; the write is parked in uvicorn's flow control
      while the request holds its admission slot and codec stream) makes the client count as gone.
    - **Lifetime** (``lifetime_s``, ``gateway.max_stream_lifetime_s``): a request still running then makes
      the client count as gone too; one whose response had not started gets 504.

    A client that counts as gone is one the app sees disconnect: ``receive`` answers ``http.disconnect``
    and later writes are dropped. The app then stops as it does for a client that left (the speech handler
    cancels its codec stream and frees its slot from inside its own generators, which a cancellation from
    out here could not guarantee), and uvicorn closes the connection with the response incomplete, so a
    cut stream cannot look complete. An app that does not notice within ``GONE_GRACE_S`` is cancelled.
    """

    def __init__(self, app: Any, *, body_timeout_s: float, send_timeout_s: float, lifetime_s: float) -> None:
        self.app = app
        self.body_timeout_s = body_timeout_s
        self.send_timeout_s = send_timeout_s
        self.lifetime_s = lifetime_s

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "")
        gone = asyncio.Event()
        state = dict.fromkeys(("body_done", "body_timed_out", "started", "expired", "complete"), False)
        loop = asyncio.get_running_loop()

        async def timed_receive() -> Message:
            if state["body_done"]:
                return await _receive_unless(receive, gone, None)  # waits for the disconnect: untimed
            try:
                message = await _receive_unless(receive, gone, self.body_timeout_s)
            except TimeoutError:
                state["body_timed_out"] = True
                raise GatewayError(
                    grpc.StatusCode.DEADLINE_EXCEEDED,
                    f"the request body stalled for {self.body_timeout_s:g} s (gateway.http_body_timeout_s)",
                    field="body",
                    reason="body_timeout",
                    http_status=408,
                ) from None
            state["body_done"] = message["type"] != "http.request" or not message.get("more_body", False)
            return message

        async def timed_send(message: Message) -> None:
            if gone.is_set():
                return  # the client counts as gone: what the app still writes is dropped
            if message["type"] == "http.response.start":
                state["started"] = True
                if state["body_timed_out"]:
                    message = {**message, "headers": [*message.get("headers", []), (b"connection", b"close")]}
            elif message["type"] == "http.response.body" and not message.get("more_body", False):
                state["complete"] = True
            try:
                async with asyncio.timeout(self.send_timeout_s):
                    await send(message)
            except TimeoutError:
                log.warning("%s: the client took no response data for %g s (gateway.stream_idle_timeout_s): "
                            "closing the connection", path, self.send_timeout_s)  # fmt: skip
                give_up()

        def give_up() -> None:
            gone.set()
            backstop.reschedule(loop.time() + GONE_GRACE_S)

        def expire() -> None:
            log.warning("%s: the request reached its time limit of %g s (gateway.max_stream_lifetime_s)",
                        path, self.lifetime_s)  # fmt: skip
            state["expired"] = True
            give_up()

        try:
            async with asyncio.timeout(None) as backstop:
                expiry = loop.call_later(self.lifetime_s, expire)
                try:
                    await self.app(scope, timed_receive, timed_send)
                finally:
                    expiry.cancel()
                    if state["started"] and not state["complete"]:
                        _end_incomplete(send, gone.is_set())
        except TimeoutError:
            if not backstop.expired():
                raise
            log.warning("%s: the app did not stop within %g s of its client counting as gone: cancelled",
                        path, GONE_GRACE_S)  # fmt: skip
        if state["expired"] and not state["started"]:
            limit = f"{self.lifetime_s:g} s (gateway.max_stream_lifetime_s)"
            err = GatewayError(
                grpc.StatusCode.DEADLINE_EXCEEDED,
                f"the request reached its time limit of {limit}",
                reason="stream_expired",
            )
            headers = [(b"content-type", b"application/json"), (b"connection", b"close")]
            await send({"type": "http.response.start", "status": 504, "headers": headers})
            await send({"type": "http.response.body", "body": json.dumps(openai_body(err)).encode()})


def _end_incomplete(send: Any, client_gone: bool) -> None:
    """A response the app left incomplete on purpose (a stream cut by a failure after its first byte, or a
    client counted as gone): the connection closes here, so the client sees the body truncated, and uvicorn
    is told the exchange is over instead of logging "ASGI callable returned without completing response"
    for every such cut (issue 26). A client that reads nothing is aborted (its unread bytes would hold a
    graceful close open); one that reads gets what was written, then the close."""
    cycle = getattr(send, "__self__", None)  # uvicorn's RequestResponseCycle behind its ``send``
    transport = getattr(cycle, "transport", None)
    if cycle is None or transport is None or not hasattr(cycle, "disconnected"):
        return  # another server: it handles an incomplete response its own way
    cycle.disconnected = True
    if client_gone:
        transport.abort()
    else:
        transport.close()


async def _receive_unless(receive: Any, gone: asyncio.Event, timeout_s: float | None) -> Message:
    """uvicorn's next message, ``http.disconnect`` once ``gone`` is set, or TimeoutError after
    ``timeout_s``. Cancelling uvicorn's ``receive`` mid-wait is safe: it only waits on an event."""
    if gone.is_set():
        return DISCONNECT
    message = asyncio.ensure_future(receive())
    wake = asyncio.ensure_future(gone.wait())
    try:
        done, _ = await asyncio.wait({message, wake}, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
    finally:
        wake.cancel()
        if not message.done():
            message.cancel()
    if message in done:
        return message.result()  # type: ignore[no-any-return]
    if wake in done:
        return DISCONNECT
    raise TimeoutError


def http_config(app: Any, gw: GatewayConfig, *, grace_s: float) -> _HttpConfig:
    """The uvicorn config of the HTTP face, with the gateway's limits on slow and oversized requests."""
    return _HttpConfig(
        HttpTimeouts(
            app,
            body_timeout_s=gw.http_body_timeout_s,
            send_timeout_s=gw.stream_idle_timeout_s,
            lifetime_s=gw.max_stream_lifetime_s,
        ),
        header_timeout_s=gw.http_header_timeout_s,
        http=GuardedH11,  # h11, never httptools: the head size limit is h11's
        h11_max_incomplete_event_size=gw.http_max_header_bytes,
        timeout_keep_alive=gw.http_keep_alive_timeout_s,
        ws_max_size=ws_max_frame_bytes(),
        log_level="warning",
        access_log=False,
        lifespan="off",
        timeout_graceful_shutdown=max(int(grace_s), 1),
    )
