"""Issue 15: a ``StreamingSynthesize`` call cannot hold its admission slot and codec stream forever.

An idle call (config, then nothing, never half-closed), a call whose client stops reading, and any call past
its lifetime end with DEADLINE_EXCEEDED naming the setting; the codec stream is cancelled and the slot freed.
A call that is speaking, or waiting for audio it asked for, is not idle.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator

import grpc
import pytest
from gateway_fakes import HANG_MARKER, FakeCodec, expected_samples
from gateway_kit import MakeStack, Stack, until

from voxstage.v1 import speech_pb2

PCM = speech_pb2.AUDIO_ENCODING_PCM_S16LE
F32 = speech_pb2.AUDIO_ENCODING_PCM_F32LE
Request = speech_pb2.StreamingSynthesizeRequest



def released(stack: Stack) -> bool:
    core = stack.gateway.core
    return (
        stack.codec.active == 0
        and core.admission.active == 0
        and all(r.in_flight == 0 for r in [*core.codecs.replicas, *core.talkers.replicas])
    )


async def held_open(*messages: Request, every_s: float | None = None) -> AsyncIterator[Request]:
    """``messages``, then no half-close: either silence, or a text delta every ``every_s`` seconds."""
    for message in messages:
        yield message
    while True:
        await asyncio.sleep(every_s or 3600)
        if every_s is not None:
            yield Request(text="more ")


async def ends_with(call: grpc.aio.StreamStreamCall) -> tuple[grpc.aio.AioRpcError, list[object], float]:
    """Read ``call`` to its end: (the error it ended with, the responses, seconds it took)."""
    start = time.monotonic()
    replies: list[object] = []
    with pytest.raises(grpc.aio.AioRpcError) as info:
        async for reply in call:
            replies.append(reply)
    return info.value, replies, time.monotonic() - start


async def test_idle_streams_end_and_free_their_slots(make_stack: MakeStack) -> None:
    stack = await make_stack(
        overrides=[
            "gateway.max_concurrent_requests=2",
            "gateway.max_queue=0",
            "gateway.stream_idle_timeout_s=0.5",
        ]
    )
    idle = [stack.stub.StreamingSynthesize(held_open(Request(config={"encoding": PCM}))) for _ in range(2)]
    await until(lambda: stack.codec.active == 2)
    # The lockout of the issue: while both idle calls are open, everyone else is refused.
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await stack.stub.Synthesize(speech_pb2.SynthesizeRequest(config={"encoding": PCM}, text="hi"))
    assert refused.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    for call in idle:
        err, replies, seconds = await ends_with(call)
        assert err.code() is grpc.StatusCode.DEADLINE_EXCEEDED
        assert "gateway.stream_idle_timeout_s" in (err.details() or "")
        assert seconds < 3.0
        assert [r.WhichOneof("response") for r in replies] == ["started"]  # type: ignore[attr-defined]
    await until(lambda: released(stack) and stack.codec.cancels == 2)
    reply = await stack.stub.Synthesize(speech_pb2.SynthesizeRequest(config={"encoding": PCM}, text="hi"))
    assert len(reply.audio) == 2 * expected_samples("hi")


async def test_a_speaking_stream_is_not_idle(make_stack: MakeStack) -> None:
    # 40 frames at 30 ms each: 1.2 s of speaking, four idle timeouts long. The client sends nothing more and
    # keeps the input open, so once the segment is done the call is idle and ends.
    stack = await make_stack(FakeCodec(frame_delay_s=0.03), overrides=["gateway.stream_idle_timeout_s=0.3"])
    text = "x" * 40
    call = stack.stub.StreamingSynthesize(
        held_open(Request(config={"encoding": PCM}), Request(text=text), Request(flush=speech_pb2.Flush()))
    )
    err, replies, seconds = await ends_with(call)
    assert err.code() is grpc.StatusCode.DEADLINE_EXCEEDED
    assert "gateway.stream_idle_timeout_s" in (err.details() or "")
    audio = sum(len(r.audio.data) for r in replies if r.HasField("audio")) // 2  # type: ignore[attr-defined]
    assert audio == expected_samples(text)
    assert 1.2 < seconds < 4.0
    await until(lambda: released(stack))


async def test_waiting_for_asked_audio_is_not_idle(make_stack: MakeStack) -> None:
    # A flushed segment that never starts is the codec's fault: its first-chunk timeout (1 s) ends the call,
    # not the idle timeout (0.2 s).
    stack = await make_stack(
        overrides=[
            "gateway.stream_idle_timeout_s=0.2",
            "connectors.connector_of_shared_memory.extra.connector_get_max_wait_first_chunk=100",
        ]
    )
    call = stack.stub.StreamingSynthesize(
        held_open(Request(config={"encoding": PCM}), Request(text=f"never {HANG_MARKER}"), Request(flush={}))
    )
    err, _, seconds = await ends_with(call)
    assert err.code() is grpc.StatusCode.DEADLINE_EXCEEDED
    assert "first-chunk timeout" in (err.details() or "") and seconds >= 0.9
    await until(lambda: released(stack))


async def test_a_client_that_stops_reading_is_ended(
    make_stack: MakeStack, caplog: pytest.LogCaptureFixture
) -> None:
    # About 15 MB of float PCM: far more than the HTTP/2 windows buffer, so the gateway's write blocks.
    stack = await make_stack(FakeCodec(frames_per_char=10), overrides=["gateway.stream_idle_timeout_s=0.5"])
    text = "y" * 200
    call = stack.stub.StreamingSynthesize(
        held_open(Request(config={"encoding": F32}), Request(text=text), Request(flush={}))
    )
    await until(lambda: stack.codec.active == 1)
    # Nobody reads: the write parks the handler, and the watch frees the stages without it.
    await until(lambda: released(stack) and stack.codec.cancels == 1, limit_s=6.0)
    err, replies, _ = await ends_with(call)
    assert err.code() is grpc.StatusCode.DEADLINE_EXCEEDED
    details = err.details() or ""
    assert "took no audio" in details and "gateway.stream_idle_timeout_s" in details
    audio = sum(len(r.audio.data) for r in replies if r.HasField("audio")) // 4  # type: ignore[attr-defined]
    assert 0 < audio < expected_samples(text, frames_per_char=10)
    assert not [r.getMessage() for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]


async def test_lifetime_limit_ends_a_busy_stream(make_stack: MakeStack) -> None:
    # Text every 0.1 s keeps the call from ever being idle; the lifetime limit ends it all the same.
    stack = await make_stack(
        overrides=["gateway.max_stream_lifetime_s=0.8", "gateway.stream_idle_timeout_s=5"]
    )
    call = stack.stub.StreamingSynthesize(held_open(Request(config={"encoding": PCM}), every_s=0.1))
    err, _, seconds = await ends_with(call)
    assert err.code() is grpc.StatusCode.DEADLINE_EXCEEDED
    assert "gateway.max_stream_lifetime_s" in (err.details() or "")
    assert 0.7 < seconds < 3.0
    await until(lambda: released(stack) and stack.codec.cancels == 1)


async def test_a_call_that_never_sends_its_config_ends(make_stack: MakeStack) -> None:
    stack = await make_stack(overrides=["gateway.stream_idle_timeout_s=0.3"])
    err, replies, seconds = await ends_with(stack.stub.StreamingSynthesize(held_open()))
    assert err.code() is grpc.StatusCode.DEADLINE_EXCEEDED and replies == []
    assert "gateway.stream_idle_timeout_s" in (err.details() or "") and seconds < 2.0
    assert stack.codec.opens == []
