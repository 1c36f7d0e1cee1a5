"""The stage's end of a link (``Codec.Link`` / ``Talker.Link``): every request of one downstream peer.

Each request on the link is served by the stage's own per-request handler (``StageServicer.Stream``), fed
from the link instead of a call of its own, so open/opened, credits, cancel, the terminal fence, errors and
segments are exactly those of docs/protocol.md §2-§11. What the link adds (§12): the downstream's ``RESET``
of one request cancels that handler as a cancelled call would; the handler's end goes back as ``END``; a
request that fails ends alone. When the link ends or breaks, every handler on it is cancelled, as gRPC
cancels the handlers of a peer that went away.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from voxstage.internal.v1 import stage_pb2 as S
from voxstage.link import wire
from voxstage.link.port import Inbox, Port, hello_of
from voxstage.transport.host import verify_peer
from voxstage.transport.payload import hello_from_proto
from voxstage.transport.shm import ShmWriter
from voxstage.transport.shm_reader import ShmReader

log = logging.getLogger(__name__)
Handler = Callable[[AsyncIterator[Any], Any], AsyncIterator[Any]]
_HALF_CLOSED = object()
_UNKNOWN = 2  # grpc.StatusCode.UNKNOWN: what gRPC reports for a handler that raised


class Aborted(Exception):
    def __init__(self, code: int, details: str) -> None:
        super().__init__(details)
        self.code = code
        self.details = details


class LinkContext:
    """What a per-request handler uses of its call (``time_remaining``, ``abort``), on a link; and the
    request's two shortcuts past the event loop (the handler sets ``take``; the link sets ``emit``)."""

    def __init__(self, timeout_ms: int, emit: Callable[[Any], None]) -> None:
        self._deadline = time.monotonic() + timeout_ms / 1000 if timeout_ms else None
        self.emit = emit  # a response straight into the link's next batch (``Outbox.sink``)
        self.inbox = Inbox()  # the request's messages, for its handler

    @property
    def take(self) -> Callable[[Any], bool] | None:
        """A request the handler takes as it arrives (``StageStream.take``): ``Inbox.take``."""
        return self.inbox.take

    @take.setter
    def take(self, take: Callable[[Any], bool] | None) -> None:
        self.inbox.take = take

    def time_remaining(self) -> float | None:
        return None if self._deadline is None else max(self._deadline - time.monotonic(), 0.0)

    async def abort(self, code: Any, details: str = "") -> None:
        """End this request's call with status ``code`` (a ``grpc.StatusCode``), as ``context.abort`` does."""
        raise Aborted(code.value[0], details)


@dataclass
class _Request:
    number: int
    context: LinkContext
    task: asyncio.Task[None] | None = None
    reset: bool = False

    @property
    def inbox(self) -> Inbox:
        return self.context.inbox

    async def messages(self) -> AsyncIterator[Any]:
        while (msg := await self.inbox.get()) is not _HALF_CLOSED:
            yield msg


class LinkSession:
    def __init__(
        self,
        handler: Handler,
        requests: wire.Schema,
        responses: wire.Schema,
        *,
        writer: ShmWriter | None,
        reader: ShmReader | None,
    ) -> None:
        self.handler = handler
        self.requests_schema = requests
        self.port = Port(responses, "upstream")
        self.writer = writer
        self.reader = reader
        self.reads_shm = False
        self.requests: dict[int, _Request] = {}
        self.highest = 0  # the highest request number seen: lower unknown numbers have ended
        self.closed = False

    async def run(self, batches: AsyncIterator[Any]) -> AsyncIterator[Any]:
        reader = asyncio.ensure_future(self._read(batches))
        try:
            while True:
                await self.port.wake.wait()
                self.port.wake.clear()
                batch = self.port.cut()
                if batch is not None:
                    yield batch
                if self.closed:
                    break
        except asyncio.CancelledError:
            pass  # the peer went away: nothing more can be written
        finally:
            self.closed = True
            reader.cancel()
            for req in list(self.requests.values()):
                if req.task is not None:
                    req.task.cancel()
            self.port.close()

    async def _read(self, batches: AsyncIterator[Any]) -> None:
        try:
            async for envelope in batches:
                batch = envelope.batch
                if batch.HasField("hello"):
                    self._hello(batch.hello)
                body = self.port.receive(batch, self.reader if self.reads_shm else None)
                for number, kind, msg, timeout_ms in wire.messages(
                    self.requests_schema, wire.unpack(batch.items), body
                ):
                    self._item(number, kind, msg, timeout_ms)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - a broken call or a malformed batch ends the link
            log.warning("link from the downstream broke: %s: %s", type(exc).__name__, exc)
        # The downstream is gone (or closed the link): its requests' calls are gone with it.
        self.closed = True
        for req in list(self.requests.values()):
            if req.task is not None:
                req.task.cancel()
        self.port.wake.set()

    def _hello(self, hello: S.TransportHello) -> None:
        peer = hello_from_proto(hello)
        verified = verify_peer(peer) if self.reader is not None else ""
        self.reads_shm = bool(verified)
        w = self.writer
        if w is not None:
            self.port.sender = w.sender(peer_readable=w.peer_can_read(peer.verified_peer_probe))
        self.port.hello = hello_of(w, verified)
        self.port.schedule()

    def _item(self, number: int, kind: int, msg: Any, timeout_ms: int) -> None:
        req = self.requests.get(number)
        if req is None:
            if number <= self.highest or kind in (wire.RESET, wire.HALF_CLOSE, wire.END):
                return  # a request that already ended: what crossed its end is dropped, as on a call
            self.highest = number
            req = self.requests[number] = _Request(number, LinkContext(timeout_ms, self._emitter(number)))
            req.task = asyncio.ensure_future(self._serve(req))
        if kind == wire.RESET:
            req.reset = True
            self.requests.pop(number, None)
            assert req.task is not None
            req.task.cancel()
        elif kind == wire.HALF_CLOSE:
            req.inbox.put_nowait(_HALF_CLOSED)
        elif kind != wire.END:
            req.inbox.put(msg)

    def _emitter(self, number: int) -> Callable[[Any], None]:
        def emit(msg: Any) -> None:
            req = self.requests.get(number)
            if req is not None and not req.reset and not self.closed:
                self.port.add(number, msg)

        return emit

    async def _serve(self, req: _Request) -> None:
        code, details = 0, ""
        try:
            async for msg in self.handler(req.messages(), req.context):
                if req.reset or self.closed:
                    continue  # the handler is finishing its cleanup; nobody reads this request any more
                self.port.add(req.number, msg)
        except asyncio.CancelledError:
            req.reset = True
        except Aborted as exc:
            code, details = exc.code, exc.details
        except Exception as exc:  # noqa: BLE001 - one request's handler failing ends that request only
            log.exception("link request %d failed", req.number)
            code, details = _UNKNOWN, f"{type(exc).__name__}: {exc}"
        finally:
            if self.requests.get(req.number) is req:
                del self.requests[req.number]
        if not req.reset and not self.closed:
            self.port.signal(req.number, wire.END, code=code, details=details)
