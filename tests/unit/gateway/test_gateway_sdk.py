"""The Python SDK (async and sync) against a gateway in front of stage doubles."""

from __future__ import annotations

import asyncio
import time

import grpc
import numpy as np
import pytest
from gateway_fakes import DROP_MARKER, FakeCodec, expected_samples
from gateway_kit import MakeStack

from voxstage.client import AsyncSpeechClient, RetryPolicy, SpeechClient, SpeechError


async def test_async_synthesize_and_stream(make_stack: MakeStack) -> None:
    stack = await make_stack()
    async with AsyncSpeechClient(stack.grpc_addr) as client:
        audio = await client.synthesize("Good morning", voice="eric", encoding="wav")
        assert audio.encoding == "wav" and audio.sample_rate == 24_000
        assert len(audio.to_numpy()) == expected_samples("Good morning")
        chunks = [c async for c in client.stream("streamed text", sample_rate=16_000)]
        total = sum(len(c.data) for c in chunks) // 2
        assert abs(total - expected_samples("streamed text") * 2 // 3) <= 2
        assert chunks[0].sample_offset == 0 and len(chunks) > 1
        voices = await client.list_voices()
        assert voices[0].name == "serena" and voices[0].native_sample_rate == 24_000


async def test_async_session_push_flush_end(make_stack: MakeStack) -> None:
    stack = await make_stack()
    async with AsyncSpeechClient(stack.grpc_addr) as client:
        session = client.session(encoding="pcm_f32", voice="ryan")
        await session.push_text("first part.")
        await session.flush()
        got: list[int] = []

        async def consume() -> None:
            async for chunk in session:
                got.append(chunk.segment_index)

        reader = asyncio.create_task(consume())
        await asyncio.sleep(0.2)
        assert got and set(got) == {0}  # the flushed segment plays before more text arrives
        await session.push_text("second")
        await session.end_input()
        await reader
        assert set(got) == {0, 1}
        assert (
            session.info is not None and session.info.encoding == "pcm_f32" and session.info.voice == "ryan"
        )
        assert session.summary is not None and session.summary.segment_count == 2
        expected = expected_samples("first part.") + expected_samples("second")
        assert session.summary.sample_count == expected


async def test_sync_client_in_a_thread(make_stack: MakeStack) -> None:
    stack = await make_stack()

    def work() -> tuple[int, int, int]:
        with SpeechClient(stack.grpc_addr) as client:
            whole = client.synthesize("sync call", encoding="pcm")
            streamed = client.synthesize_streamed("sync stream", encoding="pcm")
            with client.session(encoding="pcm") as session:
                session.push_text("a b c")
                session.flush()
                session.push_text("d")
                session.end_input()
                samples = sum(len(c.data) for c in session) // 2
            return len(whole.to_numpy()), len(streamed.to_numpy()), samples

    whole, streamed, session_samples = await asyncio.to_thread(work)
    assert whole == expected_samples("sync call")
    assert streamed == expected_samples("sync stream")
    assert session_samples == expected_samples("abcd")


async def test_errors_are_typed_and_not_retried_when_not_retryable(make_stack: MakeStack) -> None:
    stack = await make_stack()
    async with AsyncSpeechClient(stack.grpc_addr) as client:
        with pytest.raises(SpeechError) as err:
            await client.synthesize("hi", voice="nobody-here")
    assert err.value.code is grpc.StatusCode.NOT_FOUND and not err.value.retryable
    assert "nobody-here" in err.value.message


async def test_retry_before_first_audio_rides_out_overload(make_stack: MakeStack) -> None:
    # One slot, no queue: the second request is refused with a retry hint until the first one ends.
    stack = await make_stack(
        FakeCodec(frame_delay_s=0.01),
        overrides=["gateway.max_concurrent_requests=1", "gateway.max_queue=0"],
    )
    async with AsyncSpeechClient(stack.grpc_addr, retry=RetryPolicy(max_attempts=30)) as client:
        first = asyncio.create_task(client.synthesize("x" * 40, encoding="pcm"))
        await asyncio.sleep(0.1)
        second = await client.synthesize("retried", encoding="pcm")
        assert len(second.to_numpy()) == expected_samples("retried")
        assert len((await first).to_numpy()) == expected_samples("x" * 40)
    async with AsyncSpeechClient(stack.grpc_addr, retry=RetryPolicy(max_attempts=1)) as client:
        first = asyncio.create_task(client.synthesize("y" * 40, encoding="pcm"))
        await asyncio.sleep(0.1)
        with pytest.raises(SpeechError) as err:
            await client.synthesize("refused", encoding="pcm")
        assert err.value.code is grpc.StatusCode.RESOURCE_EXHAUSTED and err.value.retry_after_s is not None
        await first


async def test_no_retry_after_first_audio_chunk(make_stack: MakeStack) -> None:
    stack = await make_stack()
    async with AsyncSpeechClient(stack.grpc_addr, retry=RetryPolicy(max_attempts=5)) as client:
        received: list[bytes] = []
        with pytest.raises(SpeechError) as err:
            async for chunk in client.stream(f"abc {DROP_MARKER}"):
                received.append(chunk.data)
    # The codec vanished after one chunk: UNAVAILABLE is retryable, but audio was out, so no replay.
    assert err.value.code is grpc.StatusCode.UNAVAILABLE
    assert received and len(stack.codec.opens) == 1
    assert np.frombuffer(b"".join(received), "<i2").size > 0


async def test_sdk_deadline(make_stack: MakeStack) -> None:
    stack = await make_stack(FakeCodec(frame_delay_s=0.05))
    async with AsyncSpeechClient(stack.grpc_addr, timeout=0.3) as client:
        with pytest.raises(SpeechError) as err:
            await client.synthesize("this takes longer than the deadline " * 2)
        assert err.value.code is grpc.StatusCode.DEADLINE_EXCEEDED
        with pytest.raises(SpeechError) as err:
            async for _ in client.stream("so does this stream " * 3, timeout=0.3):
                pass
        assert err.value.code is grpc.StatusCode.DEADLINE_EXCEEDED
    start = time.monotonic()
    while stack.codec.active:  # the gateway sends `cancel` as the client's deadline passes
        assert time.monotonic() - start < 0.5, "the codec stream outlived the deadline"
        await asyncio.sleep(0.02)
    assert stack.codec.cancels == 2
