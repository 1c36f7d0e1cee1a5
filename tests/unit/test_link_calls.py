"""One stage link's requests over real gRPC (voxstage.link.client against voxstage.link.server): each behaves
as a call of its own would (its deadline, its handler's failure or abort, its cancel), and ends alone while
the other requests on the link go on (docs/protocol.md §12). The per-request handler here is the test's: the
stages' handlers run over links in tests/unit/codec/test_link.py and the integration tests."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from voxstage.internal.v1 import stage_pb2 as S
from voxstage.internal.v1 import stage_pb2_grpc
from voxstage.link.client import LinkClient
from voxstage.link.server import LinkSession
from voxstage.link.wire import CODEC_REQUESTS, CODEC_RESPONSES

pytestmark = pytest.mark.timeout(30)


class Echo(stage_pb2_grpc.CodecServicer):
    """Answers each ``text`` with a ``segment_done`` numbering it; ``text`` "raise" / "abort" / "hang" fail,
    abort or stall the request; ``end_of_input`` ends it with its terminal."""

    def __init__(self) -> None:
        self.cancelled: list[str] = []
        self.deadlines: dict[str, float | None] = {}

    async def Stream(self, requests: AsyncIterator[Any], context: Any) -> AsyncIterator[Any]:  # noqa: N802
        rid = ""
        try:
            async for msg in requests:
                kind = msg.WhichOneof("request")
                if kind == "open":
                    rid = msg.open.request_id
                    self.deadlines[rid] = context.time_remaining()
                    yield S.CodecStreamResponse(opened=S.StreamOpened(request_id=rid))
                elif kind == "text":
                    if msg.text == "raise":
                        raise RuntimeError("this request's bug")
                    if msg.text == "abort":
                        await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "aborted")
                    if msg.text == "hang":
                        await asyncio.sleep(3600)
                    yield S.CodecStreamResponse(segment_done=S.SegmentDone(segment_index=len(msg.text)))
                elif kind == "end_of_input":
                    yield S.CodecStreamResponse(end_of_stream=S.EndOfStream(reason=S.END_REASON_EOS))
                    return
        except asyncio.CancelledError:
            self.cancelled.append(rid)
            raise

    async def Link(self, batches: Any, context: Any) -> AsyncIterator[Any]:  # noqa: N802
        out = LinkSession(self.Stream, CODEC_REQUESTS, CODEC_RESPONSES, writer=None, reader=None).run(batches)
        try:
            async for batch in out:
                yield batch
        except asyncio.CancelledError:
            pass
        finally:
            await out.aclose()


async def _rig(echo: Echo | None = None) -> tuple[Echo, grpc.aio.Server, grpc.aio.Channel, LinkClient]:
    echo = echo or Echo()
    server = grpc.aio.server()
    stage_pb2_grpc.add_CodecServicer_to_server(echo, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    link = LinkClient("codec test", stage_pb2_grpc.CodecStub(channel).Link, CODEC_REQUESTS, CODEC_RESPONSES)
    return echo, server, channel, link


async def _open(link: LinkClient, rid: str, deadline_s: float | None = None) -> Any:
    call = link.stream(deadline_s)
    await call.write(S.CodecStreamRequest(open=S.StreamOpen(request_id=rid)))
    assert (await call.read()).opened.request_id == rid
    return call


async def _echo(call: Any, text: str) -> int:
    await call.write(S.CodecStreamRequest(text=text))
    return int((await call.read()).segment_done.segment_index)


async def test_each_request_fails_alone_as_its_own_call_would() -> None:
    echo, server, channel, link = await _rig()
    try:
        ok, bug, aborted, slow, dropped = [
            await _open(link, rid) for rid in ("ok", "bug", "ab", "slow", "cx")
        ]
        timed = await _open(link, "timed", deadline_s=0.3)
        assert echo.deadlines["timed"] is not None and 0 < echo.deadlines["timed"] <= 0.3
        assert echo.deadlines["ok"] is None
        await bug.write(S.CodecStreamRequest(text="raise"))
        await aborted.write(S.CodecStreamRequest(text="abort"))
        await timed.write(S.CodecStreamRequest(text="hang"))
        await slow.write(S.CodecStreamRequest(text="hang"))
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await bug.read()
        assert (
            raised.value.code() is grpc.StatusCode.UNKNOWN and "this request's bug" in raised.value.details()
        )
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await aborted.read()
        assert (raised.value.code(), raised.value.details()) == (
            grpc.StatusCode.FAILED_PRECONDITION,
            "aborted",
        )
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await timed.read()
        assert raised.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED
        assert dropped.cancel() and dropped.done()
        with pytest.raises(grpc.aio.AioRpcError):
            await dropped.read()
        # Meanwhile the others on the same link answer as before: the slow one is still waiting, unharmed.
        assert await _echo(ok, "hello") == 5
        for _ in range(50):
            if {"timed", "cx"} <= set(echo.cancelled):
                break
            await asyncio.sleep(0.02)
        assert {"timed", "cx"} <= set(echo.cancelled) and "slow" not in echo.cancelled
        await ok.write(S.CodecStreamRequest(end_of_input=S.EndOfInput()))
        assert (await ok.read()).end_of_stream.reason == S.END_REASON_EOS
        await ok.done_writing()
        assert await ok.read() is grpc.aio.EOF and ok.done()
        assert link.requests_open == 1  # the slow one
    finally:
        link.close()
        await channel.close()
        await server.stop(0)


async def test_a_broken_link_fails_its_requests_unavailable_and_the_next_request_dials_a_new_one() -> None:
    echo, server, channel, link = await _rig()
    try:
        a, b = await _open(link, "a"), await _open(link, "b")
        await server.stop(0)
        for call in (a, b):
            with pytest.raises(grpc.aio.AioRpcError) as raised:
                await call.read()
            assert raised.value.code() is grpc.StatusCode.UNAVAILABLE
            assert "link to codec test broke" in raised.value.details()
            assert call.link_broken
        with pytest.raises(asyncio.InvalidStateError):
            await a.write(S.CodecStreamRequest(text="late"))
        assert echo.cancelled.count("a") == 1 and echo.cancelled.count("b") == 1  # handlers ended with it
        again = link.stream()
        assert not again.link_broken  # a fresh link (its call fails in turn: the server is gone)
    finally:
        link.close()
        await channel.close()
