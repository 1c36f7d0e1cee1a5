"""Issue 15: the clocks of ``StreamWatch`` on their own (the end-to-end cases are in ..._grpc.py).

Here the timing is exact: the watch is asked what it would do at a given instant, so a busy machine cannot
make the answer depend on which task the event loop happens to run first.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import grpc
import pytest

from gateway.tts.stream_watch import StreamWatch
from gateway.tts.synthesis import FLUSH, InputItem


class FakeStream:
    def __init__(self) -> None:
        self.failed: list[BaseException] = []

    def fail(self, exc: BaseException) -> None:
        self.failed.append(exc)


async def source(*items: InputItem) -> AsyncIterator[InputItem]:
    for item in items:
        yield item


def attached(idle_s: float, lifetime_s: float = 60.0) -> tuple[StreamWatch, FakeStream]:
    watch = StreamWatch(idle_s, lifetime_s)
    stream = FakeStream()
    watch.attach(stream)  # type: ignore[arg-type]
    return watch, stream


async def test_time_spent_making_audio_never_counts_as_idle() -> None:
    watch, _ = attached(idle_s=0.2)
    inputs = watch.inputs(source("hello", FLUSH))
    assert await anext(inputs) == "hello" and await anext(inputs) is FLUSH  # one segment owed
    assert watch.check(time.monotonic() + 10) is None  # the server owes audio: no idle clock
    await asyncio.sleep(0.3)  # the codec takes longer than idle_s to make the next chunk
    watch.writing()
    now = time.monotonic()
    assert watch.check(now) is None  # the clock starts with the write, not at the last activity
    stalled = watch.check(now + 0.25)
    assert stalled is not None and "the client took no audio for 0.2 s" in str(stalled)
    assert await watch.written()
    watch.segment_done()  # nothing owed any more: the client's move
    now = time.monotonic()
    assert watch.check(now + 0.1) is None
    idle = watch.check(now + 0.25)
    assert idle is not None and idle.code is grpc.StatusCode.DEADLINE_EXCEEDED
    assert "no text, flush or end of input" in str(idle) and "gateway.stream_idle_timeout_s" in str(idle)
    assert idle.reason == "stream_idle_timeout"


async def test_what_starts_and_stops_the_idle_clock() -> None:
    watch = StreamWatch(idle_s=0.2, lifetime_s=5.0)
    assert watch.check(time.monotonic() + 1) is None  # not open yet: admission and open have own bounds
    watch.attach(FakeStream())  # type: ignore[arg-type]
    inputs = watch.inputs(source(FLUSH))
    assert await anext(inputs) is FLUSH  # an empty flush asks for nothing, so nothing is owed
    assert watch.check(time.monotonic() + 0.25) is not None
    with pytest.raises(StopAsyncIteration):
        await anext(inputs)  # half-close: the rest is the server's to finish
    assert watch.check(time.monotonic() + 1) is None
    expired = watch.check(watch.started + 5.0)
    assert expired is not None and "gateway.max_stream_lifetime_s" in str(expired)
    assert expired.reason == "stream_expired"


async def test_guard_fails_the_stream_or_the_stream_that_opens_late() -> None:
    async def run() -> AsyncIterator[int]:
        yield 1

    watch, stream = attached(idle_s=0.05)
    await asyncio.wait_for(watch.guard(run()), 2.0)
    assert watch.error is not None and stream.failed == [watch.error]
    # Expired while still being admitted: the stream is failed the moment it opens.
    late = StreamWatch(idle_s=10.0, lifetime_s=0.05)
    await asyncio.wait_for(late.guard(run()), 2.0)
    stream = FakeStream()
    late.attach(stream)  # type: ignore[arg-type]
    assert late.error is not None and stream.failed == [late.error]
