"""A request's life at the gateway: client cancel and disconnect, deadlines, stage timeouts, draining."""

from __future__ import annotations

import asyncio
import contextlib
import time

import grpc
import httpx
import pytest
from gateway_fakes import HANG_MARKER, FakeCodec, expected_samples
from gateway_kit import MakeStack, Stack, until

from voxstage.v1 import speech_pb2

PCM = speech_pb2.AUDIO_ENCODING_PCM_S16LE


def request(text: str) -> speech_pb2.SynthesizeRequest:
    return speech_pb2.SynthesizeRequest(config=speech_pb2.SynthesisConfig(encoding=PCM), text=text)



def idle(stack: Stack) -> bool:
    core = stack.gateway.core
    return (
        stack.codec.active == 0
        and core.admission.active == 0
        and all(r.in_flight == 0 for r in [*core.codecs.replicas, *core.talkers.replicas])
    )


async def test_grpc_client_cancel_cancels_the_codec_stream(make_stack: MakeStack) -> None:
    stack = await make_stack(FakeCodec(frame_delay_s=0.05))

    async def requests():  # type: ignore[no-untyped-def]
        yield speech_pb2.StreamingSynthesizeRequest(config=speech_pb2.SynthesisConfig(encoding=PCM))
        yield speech_pb2.StreamingSynthesizeRequest(text="a long sentence that takes a while " * 3)
        yield speech_pb2.StreamingSynthesizeRequest(flush=speech_pb2.Flush())
        await asyncio.sleep(60)  # keeps the input open

    call = stack.stub.StreamingSynthesize(requests())
    async for reply in call:
        if reply.HasField("audio"):
            break
    call.cancel()
    await until(lambda: idle(stack) and stack.codec.cancels == 1)


async def test_http_stream_disconnect_cancels(make_stack: MakeStack) -> None:
    stack = await make_stack(FakeCodec(frame_delay_s=0.05))
    async with httpx.AsyncClient(base_url=stack.http_url) as http:
        body = {"input": "long enough to still be talking " * 3, "stream": True, "response_format": "pcm"}
        async with http.stream("POST", "/v1/audio/speech", json=body) as r:
            async for _ in r.aiter_raw():
                break
    await until(lambda: stack.codec.cancels == 1 and idle(stack))


async def test_http_whole_clip_disconnect_cancels(make_stack: MakeStack) -> None:
    stack = await make_stack(FakeCodec(frame_delay_s=0.05))
    async with httpx.AsyncClient(base_url=stack.http_url) as http:
        task = asyncio.ensure_future(
            http.post("/v1/audio/speech", json={"input": "a whole clip nobody waits for " * 3})
        )
        await until(lambda: stack.codec.active == 1)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    await until(lambda: stack.codec.cancels == 1 and idle(stack))


async def test_deadline_is_propagated_and_enforced(make_stack: MakeStack) -> None:
    stack = await make_stack(FakeCodec(frame_delay_s=0.05))
    reply = await stack.stub.Synthesize(request("quick"), timeout=5.0)
    assert len(reply.audio) == 2 * expected_samples("quick")
    remaining = stack.codec.deadlines[-1]
    # The client's deadline plus the gateway's slack for sending `cancel` before the codec call expires
    # (up to 50 ms over: the deadline crosses two gRPC timeout headers, each rounded, on a busy machine).
    assert remaining is not None and 5.0 < remaining <= 6.05
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stack.stub.Synthesize(request("far too long for the deadline " * 4), timeout=0.5)
    assert err.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED
    await until(lambda: idle(stack) and stack.codec.cancels == 1, limit_s=0.5)


async def test_first_chunk_timeout(make_stack: MakeStack) -> None:
    stack = await make_stack(
        overrides=["connectors.connector_of_shared_memory.extra.connector_get_max_wait_first_chunk=20"]
    )
    start = time.monotonic()
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stack.stub.Synthesize(request(f"never {HANG_MARKER}"))
    assert err.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED
    assert "first-chunk timeout of 0.2 s" in (err.value.details() or "")
    assert time.monotonic() - start < 2.0
    await until(lambda: stack.codec.cancels == 1 and idle(stack))


async def test_stall_timeout(make_stack: MakeStack) -> None:
    # 25-frame steady chunks at 40 ms a frame leave a 1 s gap; the stall limit here is 0.3 s.
    stack = await make_stack(
        FakeCodec(frame_delay_s=0.04),
        overrides=["connectors.connector_of_shared_memory.extra.connector_get_max_wait=30"],
    )
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stack.stub.Synthesize(request("x" * 40))
    assert err.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED
    assert "stall timeout of 0.3 s" in (err.value.details() or "")
    await until(lambda: idle(stack))


async def test_drain_finishes_admitted_requests_and_refuses_new_ones(make_stack: MakeStack) -> None:
    stack = await make_stack(FakeCodec(frame_delay_s=0.02))
    in_flight = asyncio.ensure_future(stack.stub.Synthesize(request("y" * 25)))
    await until(lambda: stack.codec.active == 1)
    stopping = asyncio.ensure_future(stack.gateway.stop())
    await until(lambda: stack.gateway.core.admission.draining)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stack.stub.Synthesize(request("too late"))
    assert err.value.code() is grpc.StatusCode.UNAVAILABLE
    async with httpx.AsyncClient(base_url=stack.http_url) as http:
        # The HTTP listener closes on uvicorn's next tick (it polls should_exit every 0.1 s): until then a new
        # request still connects and is refused by the draining admission; one that connects just as uvicorn
        # shuts its connections down is closed unanswered (ReadError / RemoteProtocolError) - refused too.
        try:
            late = await http.post("/v1/audio/speech", json={"input": "too late", "response_format": "pcm"})
        except (httpx.ConnectError, httpx.ReadError, httpx.RemoteProtocolError):
            pass
        else:
            assert late.status_code == 503, late.text
    reply = await in_flight
    assert len(reply.audio) == 2 * expected_samples("y" * 25)
    await stopping
