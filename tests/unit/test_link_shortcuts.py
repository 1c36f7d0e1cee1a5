"""The shortcuts past the event loop on a stage link (voxstage.link): a request's message goes straight to
its handler (``Inbox.take``, set through ``LinkContext.take`` and ``LinkCall.take``) and a response straight
into the link's batch (``Outbox.sink``) only where nothing is queued before it, so each request's order is
the one its queue keeps. Over real gRPC, as tests/unit/test_link_calls.py; the stages' own handlers take
these paths in tests/unit/codec/test_link.py and the duplex integration tests."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest

from tests.unit.test_link_calls import Echo, _rig
from voxstage.internal.v1 import stage_pb2 as S
from voxstage.link.client import LinkCall
from voxstage.stage.stream import Outbox

pytestmark = pytest.mark.timeout(30)


def _done(n: int) -> S.CodecStreamResponse:
    return S.CodecStreamResponse(segment_done=S.SegmentDone(segment_index=n))


async def test_the_outbox_goes_straight_out_only_with_nothing_queued_and_never_after_the_terminal() -> None:
    out, sent = Outbox(), []
    out.put_nowait(_done(0))  # no sink yet: queued
    out.sink = sent.append
    out.put_nowait(_done(1))  # behind a queued message: queued too
    assert sent == []
    assert [(await out.get()).segment_done.segment_index for _ in range(2)] == [0, 1]
    out.put_nowait(_done(2))
    assert [m.segment_done.segment_index for m in sent] == [2]
    eos = S.CodecStreamResponse(end_of_stream=S.EndOfStream(reason=S.END_REASON_EOS))
    out.put_nowait(eos)  # the terminal is the handler's to send, and seals the shortcut
    out.put_nowait(_done(3))
    assert len(sent) == 1 and out.sink is None
    assert await out.get() == eos and (await out.get()).segment_done.segment_index == 3


class Recorder(Echo):
    """Takes ``text`` starting with "now" at once when the link offers it (``context.take``); its read loop
    records the rest, and sleeps on "slow"; ``end_of_input`` ends the request. On a link as ``Echo``."""

    def __init__(self) -> None:
        super().__init__()
        self.order: list[tuple[str, str]] = []

    def take(self, msg: Any) -> bool:
        if msg.WhichOneof("request") != "text" or not msg.text.startswith("now"):
            return False
        self.order.append(("take", msg.text))
        return True

    async def Stream(self, requests: AsyncIterator[Any], context: Any) -> AsyncIterator[Any]:  # noqa: N802
        context.take = self.take
        async for msg in requests:
            kind = msg.WhichOneof("request")
            if kind == "open":
                yield S.CodecStreamResponse(opened=S.StreamOpened(request_id=msg.open.request_id))
            elif kind == "text":
                self.order.append(("loop", msg.text))
                if msg.text == "slow":
                    await asyncio.sleep(0.3)
                yield _done(len(self.order))
            elif kind == "end_of_input":
                yield S.CodecStreamResponse(end_of_stream=S.EndOfStream(reason=S.END_REASON_EOS))
                return


@contextlib.asynccontextmanager
async def _opened_request(rec: Recorder) -> AsyncIterator[LinkCall]:
    """A link to ``rec`` over real gRPC with one request open on it."""
    _, server, channel, link = await _rig(rec)
    try:
        call = link.stream(10)
        await call.write(S.CodecStreamRequest(open=S.StreamOpen(request_id="r")))
        assert (await call.read()).HasField("opened")
        yield call
    finally:
        link.close()
        await channel.close()
        await server.stop(None)


async def test_a_request_is_taken_at_once_only_while_its_reader_waits_on_an_empty_inbox() -> None:
    rec = Recorder()
    async with _opened_request(rec) as call:
        reader_got: list[str] = []

        async def reader() -> None:
            async for resp in call:
                reader_got.append(resp.WhichOneof("response"))

        reading = asyncio.ensure_future(reader())
        await call.write(S.CodecStreamRequest(text="now1"))  # the reader waits, nothing queued: taken
        await call.write(S.CodecStreamRequest(text="slow"))  # the loop's ...
        await call.write(S.CodecStreamRequest(text="nowA"))  # ... and in the same batch queued behind it
        await asyncio.sleep(0.5)
        await call.write(S.CodecStreamRequest(text="slow"))
        await asyncio.sleep(0.1)
        await call.write(S.CodecStreamRequest(text="nowB"))  # nothing queued, but the loop is busy: queued
        await asyncio.sleep(0.5)
        await call.write(S.CodecStreamRequest(text="now4"))  # the loop waits again: taken
        await asyncio.sleep(0.1)
        await call.write(S.CodecStreamRequest(end_of_input=S.EndOfInput()))
        await call.done_writing()
        await asyncio.wait_for(reading, 5)
        loop = [("loop", "slow"), ("loop", "nowA"), ("loop", "slow"), ("loop", "nowB")]
        assert rec.order == [("take", "now1"), *loop, ("take", "now4")]
        assert reader_got == ["segment_done"] * 4 + ["end_of_stream"]  # the loop's answers


async def test_a_response_is_taken_at_once_by_the_request_and_the_rest_still_reach_its_reader() -> None:
    rec = Recorder()
    async with _opened_request(rec) as call:
        taken: list[int] = []
        call.take = lambda resp: (
            resp.WhichOneof("response") == "segment_done"
            and not taken.append(resp.segment_done.segment_index)
        )
        got: list[str] = []

        async def reader() -> None:
            async for resp in call:
                got.append(resp.WhichOneof("response"))

        reading = asyncio.ensure_future(reader())
        await asyncio.sleep(0.05)  # the reader waits on its inbox
        for text in ("a", "b"):
            await call.write(S.CodecStreamRequest(text=text))
            await asyncio.sleep(0.1)
        await call.write(S.CodecStreamRequest(end_of_input=S.EndOfInput()))
        await call.done_writing()
        await asyncio.wait_for(reading, 5)
        assert taken == [1, 2] and got == ["end_of_stream"]
