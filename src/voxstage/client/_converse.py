"""Full-duplex sessions over ``Speech.Converse``, async and blocking.

::

    async with client.converse(voice="NATF2", instructions="You are a helpful assistant.") as session:
        await session.send_audio(pcm_24k_s16le)       # any size, as it is captured
        ...
        await session.close()                         # clean end: the model's last audio still comes
        async for event in session:                   # AgentAudio, AgentTranscript, ServerNotice, ...
            ...

Entering the session waits for the server's ``session.created`` (and ``session.updated`` when settings were
given), so a refusal (every session slot taken: RESOURCE_EXHAUSTED, retried by the client's policy; a
deployment that does not converse: FAILED_PRECONDITION; a bad setting) raises ``SpeechError`` there,
before any audio is sent. Iteration ends after ``ResponseDone``; a session that fails raises
``SpeechError`` from the iteration. Leaving the ``with`` block cancels a session that is still running.
"""

from __future__ import annotations

import asyncio
import queue
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import grpc

from voxstage.client._common import RetryPolicy, SpeechError, error_from_rpc
from voxstage.client._converse_common import (
    ConverseEvent,
    ResponseDone,
    ServerNotice,
    SessionInfo,
    appends,
    event_from,
)
from voxstage.v1 import speech_pb2, speech_pb2_grpc


def _refused(notice: ServerNotice) -> SpeechError:
    code = (
        grpc.StatusCode.NOT_FOUND if notice.code.endswith("not_found") else grpc.StatusCode.INVALID_ARGUMENT
    )
    return SpeechError(code, notice.message)


class AsyncConverseSession:
    def __init__(
        self,
        stub: speech_pb2_grpc.SpeechStub,
        update: speech_pb2.ConverseRequest,
        *,
        timeout: float | None,
        retry: RetryPolicy,
    ) -> None:
        self._stub = stub
        self._update = update
        self._timeout = timeout
        self._retry = retry
        self._queue: asyncio.Queue[speech_pb2.ConverseRequest | None] = asyncio.Queue()
        self._call: Any = None
        self._closed = False
        self._cancelled = False
        self.info: SessionInfo | None = None

    async def _requests(self) -> AsyncIterator[speech_pb2.ConverseRequest]:
        while (item := await self._queue.get()) is not None:
            yield item

    async def _read(self) -> speech_pb2.ConverseResponse | None:
        try:
            reply = await self._call.read()
        except grpc.aio.AioRpcError as exc:
            if self._cancelled and exc.code() is grpc.StatusCode.CANCELLED:
                return None
            raise error_from_rpc(exc) from None
        return None if reply is grpc.aio.EOF else reply

    async def __aenter__(self) -> AsyncConverseSession:
        attempt = 1
        while True:
            self._queue = asyncio.Queue()
            self._call = self._stub.Converse(self._requests(), timeout=self._timeout)
            try:
                await self._open()
                return self
            except SpeechError as err:
                self._call.cancel()
                delay = self._retry.delay(attempt, err)
                if delay is None:
                    raise
            attempt += 1
            await asyncio.sleep(delay)

    async def _open(self) -> None:
        created = await self._read()
        if created is None or created.WhichOneof("event") != "session_created":
            raise SpeechError(grpc.StatusCode.INTERNAL, "the server did not open the session")
        self.info = event_from(created)  # type: ignore[assignment]
        self._queue.put_nowait(self._update)
        while True:
            reply = await self._read()
            if reply is None:
                raise SpeechError(grpc.StatusCode.INTERNAL, "the session ended before session.updated")
            event = event_from(reply)
            if isinstance(event, SessionInfo):
                self.info = event
                return
            if isinstance(event, ServerNotice):
                raise _refused(event)

    async def __aexit__(self, *exc: object) -> None:
        await self.cancel()

    async def send_audio(self, data: bytes) -> None:
        """Client audio in the session's input format, any chunk size (stream it as it is captured)."""
        if self._closed:
            raise RuntimeError("send_audio() after close()")
        for request in appends(data):
            self._queue.put_nowait(request)

    async def close(self) -> None:
        """End the session cleanly: iterate on to receive the model's last audio and ``ResponseDone``."""
        if not self._closed:
            self._closed = True
            self._queue.put_nowait(None)

    async def cancel(self) -> None:
        """Drop the session at once (the server frees its slot within a tick)."""
        if self._call is not None and not self._call.done():
            self._cancelled = True
            self._call.cancel()

    def __aiter__(self) -> AsyncIterator[ConverseEvent]:
        return self._events()

    async def _events(self) -> AsyncIterator[ConverseEvent]:
        while (reply := await self._read()) is not None:
            event = event_from(reply)
            if isinstance(event, SessionInfo):
                self.info = event
            elif isinstance(event, ResponseDone):
                await self.close()  # the session is over: half-close, so the call ends with its status
            if event is not None:
                yield event


class ConverseSession:
    """The blocking twin of ``AsyncConverseSession`` (``send_audio`` may be called from another thread)."""

    def __init__(
        self,
        stub: speech_pb2_grpc.SpeechStub,
        update: speech_pb2.ConverseRequest,
        *,
        timeout: float | None,
        retry: RetryPolicy,
    ) -> None:
        self._stub = stub
        self._update = update
        self._timeout = timeout
        self._retry = retry
        self._queue: queue.Queue[speech_pb2.ConverseRequest | None] = queue.Queue()
        self._call: Any = None
        self._closed = False
        self._cancelled = False
        self.info: SessionInfo | None = None

    def _requests(self, q: queue.Queue[speech_pb2.ConverseRequest | None]) -> Iterator[Any]:
        while (item := q.get()) is not None:
            yield item

    def _next(self) -> speech_pb2.ConverseResponse | None:
        try:
            return next(self._call)
        except StopIteration:
            return None
        except grpc.RpcError as exc:
            if self._cancelled and exc.code() is grpc.StatusCode.CANCELLED:  # type: ignore[attr-defined]
                return None
            raise error_from_rpc(exc) from None

    def __enter__(self) -> ConverseSession:
        attempt = 1
        while True:
            self._queue = queue.Queue()
            self._call = self._stub.Converse(self._requests(self._queue), timeout=self._timeout)
            try:
                self._open()
                return self
            except SpeechError as err:
                self._call.cancel()
                delay = self._retry.delay(attempt, err)
                if delay is None:
                    raise
            attempt += 1
            time.sleep(delay)

    def _open(self) -> None:
        created = self._next()
        if created is None or created.WhichOneof("event") != "session_created":
            raise SpeechError(grpc.StatusCode.INTERNAL, "the server did not open the session")
        self.info = event_from(created)  # type: ignore[assignment]
        self._queue.put(self._update)
        while (reply := self._next()) is not None:
            event = event_from(reply)
            if isinstance(event, SessionInfo):
                self.info = event
                return
            if isinstance(event, ServerNotice):
                raise _refused(event)
        raise SpeechError(grpc.StatusCode.INTERNAL, "the session ended before session.updated")

    def __exit__(self, *exc: object) -> None:
        self.cancel()

    def send_audio(self, data: bytes) -> None:
        if self._closed:
            raise RuntimeError("send_audio() after close()")
        for request in appends(data):
            self._queue.put(request)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._queue.put(None)

    def cancel(self) -> None:
        if self._call is not None and self._call.running():
            self._cancelled = True
            self._call.cancel()
        self._queue.put(None)  # lets gRPC's request thread finish

    def __iter__(self) -> Iterator[ConverseEvent]:
        while (reply := self._next()) is not None:
            event = event_from(reply)
            if isinstance(event, SessionInfo):
                self.info = event
            elif isinstance(event, ResponseDone):
                self.close()
            if event is not None:
                yield event
