"""A text the gateway already holds when a stream opens rides in the open (gateway/tts/first_input.py,
docs/protocol.md §2): a whole-text request's text and end of input, the same on a retried open, and nothing
when the text is not there yet. The stages' side is tests/integration/test_stages.py (the same audio)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest
from gateway_fakes import expected_samples
from gateway_kit import MakeStack

from gateway.errors import invalid
from gateway.tts.first_input import FirstInput
from voxstage.v1 import speech_pb2

PCM = speech_pb2.AUDIO_ENCODING_PCM_S16LE


def request(text: str) -> speech_pb2.SynthesizeRequest:
    return speech_pb2.SynthesizeRequest(config=speech_pb2.SynthesisConfig(encoding=PCM), text=text)


async def test_a_whole_text_rides_in_the_open_also_when_it_is_retried(make_stack: MakeStack) -> None:
    stack = await make_stack(talkers=2)
    stack.codec.dead_talkers.add(stack.talkers[0].address)  # one open is refused, then retried
    for _ in range(2):
        reply = await stack.stub.Synthesize(request("whole text in the open"))
        assert len(reply.audio) == 2 * expected_samples("whole text in the open")
    assert len(stack.codec.opens) == 3
    assert {(op.initial_text, op.initial_end_of_input) for op in stack.codec.opens} == {
        ("whole text in the open", True)
    }


async def test_a_streamed_text_that_comes_later_goes_after_opened(make_stack: MakeStack) -> None:
    stack = await make_stack()
    S = speech_pb2.StreamingSynthesizeRequest
    go = asyncio.Event()

    async def requests() -> AsyncIterator[speech_pb2.StreamingSynthesizeRequest]:
        yield S(config=speech_pb2.SynthesisConfig(encoding=PCM))
        await go.wait()
        yield S(text="later text")

    audio = 0
    async for reply in stack.stub.StreamingSynthesize(requests()):
        if reply.WhichOneof("response") == "started":
            go.set()
        elif reply.WhichOneof("response") == "audio":
            audio += len(reply.audio.data)
    assert audio == 2 * expected_samples("later text")
    (op,) = stack.codec.opens
    assert op.initial_text == "" and not op.initial_end_of_input


async def items(*values: object, fail: Exception | None = None) -> AsyncIterator[object]:
    for v in values:
        await asyncio.sleep(0)
        yield v
    if fail is not None:
        raise fail


def refuse_long(text: str) -> None:
    if len(text) > 5:
        raise invalid("text", "too long")


async def test_what_rides_in_the_open_and_what_the_pump_still_gets() -> None:
    first = FirstInput(items("hello", "world"), refuse_long)
    assert first.for_open() == ("", False)  # not read yet: nothing rides
    await asyncio.sleep(0.01)
    assert first.for_open() == ("hello", False)  # more input follows: the end does not ride
    first.opened()
    assert first.sent == "hello" and not first.ended_in_open
    assert [x async for x in first.items()] == ["hello", "world"]
    first.close()

    whole = FirstInput(items("hi"), refuse_long)
    await asyncio.sleep(0.01)
    assert whole.for_open() == ("hi", True)
    for refused in (FirstInput(items("too long"), refuse_long), FirstInput(items("  "), refuse_long)):
        await asyncio.sleep(0.01)
        assert refused.for_open() == ("", False)  # the pump refuses it (or skips it) after `opened`
        refused.close()
    off = FirstInput(items("hi"), refuse_long, enabled=False)
    await asyncio.sleep(0.01)
    assert off.for_open() == ("", False)
    off.close()


async def test_a_failing_input_fails_the_pump_not_the_open() -> None:
    first = FirstInput(items("hi", fail=ValueError("client went away")), refuse_long)
    await asyncio.sleep(0.01)
    assert first.for_open() == ("hi", False)  # the end is not known: the failure comes after the text
    got = []
    with pytest.raises(ValueError, match="client went away"):
        async for x in first.items():
            got.append(x)
    assert got == ["hi"]
    first.close()


async def test_the_open_waits_a_moment_for_a_text_and_its_end_and_no_longer() -> None:
    whole = FirstInput(items("hi"), refuse_long)  # text and end a few loop turns after the config
    await whole.settle()
    assert whole.for_open() == ("hi", True)
    whole.close()

    async def later() -> AsyncIterator[object]:  # an LLM's first delta, long after the config
        await asyncio.sleep(1.0)
        yield "late"

    slow = FirstInput(later(), refuse_long)
    t0 = time.monotonic()
    await slow.settle(0.005)
    assert time.monotonic() - t0 < 0.5 and slow.for_open() == ("", False)
    slow.close()

    streamed = FirstInput(items("hello", "world"), refuse_long)  # more text follows: the end never rides
    await streamed.settle()
    assert streamed.for_open() == ("hello", False)
    streamed.close()
