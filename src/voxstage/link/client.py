"""The downstream's end of a stage link: one long-lived ``Link`` call to one upstream peer, shared by every
request to it (docs/protocol.md §12).

``LinkClient.stream(timeout)`` returns a ``LinkCall``, which a request's code drives exactly as it drives the
``grpc.aio`` call of ``Stream`` (``write``, ``done_writing``, ``read`` / ``async for``, ``cancel``, ``done``),
so the per-request protocol code is one code path whichever carries it. What a call of its own gave for
free, the link gives per request: a reader that never blocks on one request (each has its own inbox, bounded
by the protocol's credits), its deadline (``DEADLINE_EXCEEDED``, the upstream hears ``RESET``), its cancel
(``RESET``) and its status (``END``). When the link breaks, every request on it fails with ``UNAVAILABLE``
("link to ... broke"), which is what a call of its own reported when its peer died; the next request dials a
new link.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc

from voxstage.internal.v1 import stage_pb2 as S
from voxstage.link import wire
from voxstage.link.port import Inbox, Port, hello_of
from voxstage.transport.host import Hello, verify_peer
from voxstage.transport.payload import hello_from_proto
from voxstage.transport.shm import ShmWriter
from voxstage.transport.shm_reader import ShmReader

log = logging.getLogger(__name__)
_EOF = grpc.aio.EOF
CLOSED = "closed by this end"


def _error(code: grpc.StatusCode, details: str) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details)


class LinkCall:
    """One request on a link, with the subset of ``grpc.aio.StreamStreamCall`` the stages' code uses."""

    def __init__(self, conn: _Conn, number: int, timeout: float | None) -> None:
        self._conn = conn
        self.number = number
        self._inbox = Inbox()
        self._done = False
        self._timeout_ms = 0 if timeout is None else max(int(timeout * 1000), 1)
        self._timer = (
            None if timeout is None else asyncio.get_running_loop().call_later(timeout, self._expired)
        )

    # -- downstream -> upstream --------------------------------------------------------------------------
    async def write(self, msg: Any) -> None:
        self.write_nowait(msg)

    def write_nowait(self, msg: Any) -> None:
        """``write`` without the await: a request's write on a link never waits (its batch goes on the
        next turn of the event loop)."""
        if self._done:
            raise asyncio.InvalidStateError("write on a finished link request")
        timeout_ms, self._timeout_ms = self._timeout_ms, 0
        if msg.WhichOneof("request") == "open" and msg.open.HasField("transport"):
            # Payloads of a request on a link go inline (the link puts the tick's slab in shared memory),
            # so the request's own transport offers nothing to verify.
            msg = type(msg)(open=msg.open)
            msg.open.transport.probe_region = ""
            msg.open.transport.verified_peer_probe = ""
        self._conn.port.add(self.number, msg, timeout_ms=timeout_ms)

    async def done_writing(self) -> None:
        if not self._done:
            self._conn.port.signal(self.number, wire.HALF_CLOSE)

    def cancel(self) -> bool:
        if self._done:
            return False
        self._conn.forget(self.number)
        self._conn.port.signal(self.number, wire.RESET)
        self._finish(_error(grpc.StatusCode.CANCELLED, "Locally cancelled by application!"))
        return True

    def done(self) -> bool:
        return self._done

    @property
    def link_broken(self) -> bool:
        """The link under this request broke (not only this request ended)."""
        return self._conn.broken is not None

    # -- upstream -> downstream --------------------------------------------------------------------------
    @property
    def take(self) -> Callable[[Any], bool] | None:
        """A response the request's code handles as it arrives (the codec's duplex relay, the gateway's
        stream): ``Inbox.take``."""
        return self._inbox.take

    @take.setter
    def take(self, take: Callable[[Any], bool] | None) -> None:
        self._inbox.take = take

    async def read(self) -> Any:
        item = await self._inbox.get()
        if item is _EOF or isinstance(item, grpc.aio.AioRpcError):
            self._inbox.put_nowait(item)  # every later read sees the end too
            if item is _EOF:
                return _EOF
            raise item
        return item

    def __aiter__(self) -> AsyncIterator[Any]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[Any]:
        while (msg := await self.read()) is not _EOF:
            yield msg

    # -- the link's side ---------------------------------------------------------------------------------
    def deliver(self, msg: Any) -> None:
        self._inbox.put(msg)

    def end(self, code: int, details: str) -> None:
        """The upstream's handler returned (status ``code``)."""
        if code == 0:
            self._finish(_EOF)
        else:
            self._finish(_error(_status(code), details or "the upstream handler failed"))

    def fail(self, error: grpc.aio.AioRpcError) -> None:
        self._finish(error)

    def _finish(self, end: Any) -> None:
        if self._done:
            return
        self._done = True
        if self._timer is not None:
            self._timer.cancel()
        self._inbox.put_nowait(end)

    def _expired(self) -> None:
        if self._done:
            return
        self._conn.forget(self.number)
        self._conn.port.signal(self.number, wire.RESET)
        self._finish(_error(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded"))


def _status(code: int) -> grpc.StatusCode:
    for status in grpc.StatusCode:
        if status.value[0] == code:
            return status
    return grpc.StatusCode.UNKNOWN


class _Conn:
    """One ``Link`` call and the requests on it."""

    def __init__(self, client: LinkClient, peer: Hello | None) -> None:
        self.client = client
        self.call = client.open_call()
        self.calls: dict[int, LinkCall] = {}
        self.numbers = itertools.count(1)
        self.port = Port(client.requests, "downstream")
        self.broken: str | None = None
        self.peer_probe = peer.probe_region if peer is not None else ""
        verified = verify_peer(peer) if (client.reader is not None and peer is not None) else ""
        self.reads_shm = bool(verified)
        w = client.writer
        self.port.hello = hello_of(w, verified)
        self.port.schedule()
        self.tasks = [asyncio.ensure_future(self._write()), asyncio.ensure_future(self._read())]

    def open(self, timeout: float | None) -> LinkCall:
        call = LinkCall(self, next(self.numbers), timeout)
        self.calls[call.number] = call
        return call

    def forget(self, number: int) -> None:
        self.calls.pop(number, None)

    async def _write(self) -> None:
        try:
            while True:
                await self.port.wake.wait()
                self.port.wake.clear()
                batch = self.port.cut()
                if batch is not None:
                    await self.call.write(batch)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - the call died: the reader reports why
            log.debug("link to %s: write failed: %s", self.client.name, exc)

    async def _read(self) -> None:
        try:
            async for envelope in self.call:
                batch = envelope.batch
                if batch.HasField("hello"):
                    self._hello(batch.hello)
                body = self.port.receive(batch, self.client.reader if self.reads_shm else None)
                records = wire.unpack(batch.items)
                for number, kind, msg, _ in wire.messages(self.client.responses, records, body):
                    call = self.calls.get(number)
                    if call is None:
                        continue  # cancelled here, or timed out: what crossed it is dropped
                    if kind == wire.END:
                        del self.calls[number]
                        call.end(*msg)
                    elif kind != wire.RESET and kind != wire.HALF_CLOSE:
                        call.deliver(msg)
            reason = "the link call ended"
        except asyncio.CancelledError:
            raise
        except grpc.aio.AioRpcError as exc:
            reason = f"{exc.code().name}: {exc.details()}"
        except Exception as exc:  # noqa: BLE001 - a malformed batch breaks the link, not the process
            reason = f"{type(exc).__name__}: {exc}"
        self._break(reason)

    def _hello(self, hello: S.TransportHello) -> None:
        w = self.client.writer
        if w is not None and self.port.sender is None:
            readable = w.peer_can_read(hello_from_proto(hello).verified_peer_probe)
            self.port.sender = w.sender(peer_readable=readable)

    def _break(self, reason: str) -> None:
        if self.broken is not None:
            return
        self.broken = reason
        if reason != CLOSED:
            log.warning("link to %s broke: %s", self.client.name, reason)
        for task in self.tasks:
            if task is not asyncio.current_task():
                task.cancel()
        self.call.cancel()
        self.port.close()
        calls, self.calls = self.calls, {}
        error = _error(grpc.StatusCode.UNAVAILABLE, f"link to {self.client.name} broke: {reason}")
        for call in calls.values():
            call.fail(error)
        if self.reads_shm and self.client.reader is not None and self.peer_probe:
            self.client.reader.reap_peer(self.peer_probe)

    def close(self) -> None:
        self._break(CLOSED)


class LinkClient:
    """The link to one upstream peer. ``open_call`` starts a ``Link`` call (``stub.Link``); ``writer`` /
    ``reader`` are this end's shared memory (None: none)."""

    def __init__(
        self,
        name: str,
        open_call: Callable[[], Any],
        requests: wire.Schema,
        responses: wire.Schema,
        *,
        writer: ShmWriter | None = None,
        reader: ShmReader | None = None,
    ) -> None:
        self.name = name
        self.open_call = open_call
        self.requests = requests
        self.responses = responses
        self.writer = writer
        self.reader = reader
        self._conn: _Conn | None = None

    def stream(self, timeout: float | None = None, peer: Hello | None = None) -> LinkCall:
        """A new request on the link (a new link if there is none or the last one broke); ``peer``: the
        upstream's hello from its Status, for the shared-memory verdict of a new link."""
        if self._conn is None or self._conn.broken is not None:
            self._conn = _Conn(self, peer)
        return self._conn.open(timeout)

    @property
    def requests_open(self) -> int:
        return 0 if self._conn is None or self._conn.broken else len(self._conn.calls)

    def close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):
                self._conn.close()
            self._conn = None
