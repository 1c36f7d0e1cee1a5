"""``CodecStream``'s receive path (gateway/upstream.py): messages wake every receiver, so a second one (a
session's close grace cancels while its runner still waits) never strands the first; a receiver that times
out cancels the stream, and the other receiver's wait ends with it."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest

from bench.receive_path import MemoryCall, Replica
from gateway.errors import GatewayError
from gateway.upstream import CodecStream, Timeouts
from voxstage.internal.v1 import stage_pb2 as S


class Pool:
    def suspect(self, replica: Any, why: str) -> None:
        pass

    def mark_down(self, replica: Any, why: str) -> None:
        pass


def pcm(n: int) -> S.CodecStreamResponse:
    return S.CodecStreamResponse(pcm=S.PcmChunk(sample_offset=n, sample_count=1, format=S.PCM_FORMAT_F32LE))


async def opened_stream(stall_s: float = 30.0) -> tuple[CodecStream, MemoryCall]:
    replica = Replica()
    stream = CodecStream(Pool(), replica, timeouts=Timeouts(30.0, stall_s), deadline_s=None)  # type: ignore[arg-type]
    (call,) = replica.calls  # the stream's own call (this replica offers no link)
    call.inbox.put_nowait(S.CodecStreamResponse(opened=S.StreamOpened()))
    await stream.open(S.StreamOpen(initial_credit=S.Credit(amount=64)), min_chunk_samples=1)
    return stream, call


async def test_two_receivers_each_get_a_message() -> None:
    stream, call = await opened_stream()
    first = asyncio.ensure_future(stream._receive(None, ""))
    await asyncio.sleep(0.01)
    second = asyncio.ensure_future(stream._receive(None, ""))
    await asyncio.sleep(0.01)
    call.inbox.put_nowait(pcm(1))
    call.inbox.put_nowait(pcm(2))
    got = await asyncio.wait_for(asyncio.gather(first, second), 5)
    assert sorted(m.pcm.sample_offset for m in got) == [1, 2]
    stream.close()


async def test_a_receiver_that_times_out_cancels_the_stream_and_ends_the_other_receiver() -> None:
    stream, call = await opened_stream()
    stream.tick_s = 0.01  # the cancel's grace: a tick plus 100 ms
    loop = asyncio.get_running_loop()
    waiting = asyncio.ensure_future(stream._receive(None, ""))  # no work owed: no timeout of its own
    await asyncio.sleep(0.01)
    with pytest.raises(GatewayError) as err:
        await stream._receive(loop.time() + 0.05, "opened")
    assert err.value.code.name == "DEADLINE_EXCEEDED"
    assert [m.WhichOneof("request") for m in call.written][-1] == "cancel"
    with pytest.raises(asyncio.CancelledError):  # the stream is gone: the other wait ends with it
        await asyncio.wait_for(waiting, 5)
    assert not stream._waiters


async def test_a_failure_wakes_the_receiver_before_queued_messages() -> None:
    stream, _ = await opened_stream()
    waiting = asyncio.ensure_future(stream._receive(None, ""))
    await asyncio.sleep(0.01)
    stream._deliver(pcm(4))  # in the same loop step as the input side's failure:
    stream.fail(GatewayError(grpc.StatusCode.INVALID_ARGUMENT, "input_audio: not base64"))
    with pytest.raises(GatewayError) as err:
        await asyncio.wait_for(waiting, 5)
    assert err.value.code is grpc.StatusCode.INVALID_ARGUMENT  # the failure comes first
    stream.close()
