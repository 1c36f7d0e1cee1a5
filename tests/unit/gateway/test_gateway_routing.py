"""Routing across replicas: least-loaded choice, failover, fail-fast on a dead stage, recovery."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import grpc
import pytest
from gateway_fakes import FakeCodec, FakeTalker, expected_samples, start_codec
from gateway_kit import MakeStack

from voxstage.gateway.routing import parse_addresses
from voxstage.v1 import speech_pb2

PCM = speech_pb2.AUDIO_ENCODING_PCM_S16LE


async def wait_for(condition: Callable[[], bool], limit_s: float = 10.0) -> None:
    """Poll ``condition``: the background probe loop has no event a test could wait on."""
    deadline = time.monotonic() + limit_s
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.05)


def request(text: str, **kw: object) -> speech_pb2.SynthesizeRequest:
    return speech_pb2.SynthesizeRequest(config=speech_pb2.SynthesisConfig(encoding=PCM, **kw), text=text)


def test_parse_addresses_names_the_flag() -> None:
    assert parse_addresses("a:1, b:2", flag="--codec") == ["a:1", "b:2"]
    for bad in ("nohost", "h:0", "h:x", "a:1,a:1", ":5"):
        with pytest.raises(ValueError, match="--codec"):
            parse_addresses(bad, flag="--codec")


async def test_least_loaded_spreads_concurrent_requests(make_stack: MakeStack) -> None:
    stack = await make_stack(FakeCodec(frame_delay_s=0.01), FakeCodec(frame_delay_s=0.01))
    replies = await asyncio.gather(*(stack.stub.Synthesize(request("x" * 30)) for _ in range(6)))
    assert all(len(r.audio) == 2 * expected_samples("x" * 30) for r in replies)
    a, b = (d.servicer for d in stack.codecs)
    assert len(a.opens) == 3 and len(b.opens) == 3
    assert all(r.in_flight == 0 for r in stack.gateway.core.codecs.replicas)


async def test_dead_replica_is_skipped_then_probed_back(make_stack: MakeStack) -> None:
    stack = await make_stack(FakeCodec(), FakeCodec())
    dead = stack.codecs[0]
    port = dead.port
    await dead.server.stop(0)
    # Every request still succeeds: a failure before `opened` marks the replica down and moves on.
    for _ in range(4):
        reply = await stack.stub.Synthesize(request("still fine"))
        assert len(reply.audio) == 2 * expected_samples("still fine")
    pool = stack.gateway.core.codecs
    assert pool.replicas[0].down and not pool.replicas[1].down
    assert len(stack.codecs[1].servicer.opens) == 4
    # Back on the same address: a background probe brings it into rotation again.
    revived = await start_codec(FakeCodec(), port=port)
    stack.codecs.append(revived)
    await wait_for(lambda: not pool.replicas[0].down)
    await asyncio.gather(*(stack.stub.Synthesize(request("spread")) for _ in range(4)))
    assert revived.servicer.opens


async def test_dead_stage_fails_fast_with_unavailable(make_stack: MakeStack) -> None:
    stack = await make_stack()
    await stack.codecs[0].server.stop(0)
    with pytest.raises(grpc.aio.AioRpcError):
        await stack.stub.Synthesize(request("first notices"))
    start = time.monotonic()
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stack.stub.Synthesize(request("fails fast"))
    assert time.monotonic() - start < 0.5
    assert err.value.code() is grpc.StatusCode.UNAVAILABLE
    assert "no codec replica is available" in (err.value.details() or "")


async def test_talker_refusal_marks_that_talker_down_and_uses_another(make_stack: MakeStack) -> None:
    stack = await make_stack(talkers=2)
    first, second = stack.talkers
    stack.codec.dead_talkers.add(first.address)
    pool = stack.gateway.core.talkers
    for _ in range(3):
        reply = await stack.stub.Synthesize(request("via the live talker"))
        assert len(reply.audio) == 2 * expected_samples("via the live talker")
    assert pool.replicas[0].down and not pool.replicas[1].down
    assert {op.talker_address for op in stack.codec.opens} == {first.address, second.address}
    assert [op.talker_address for op in stack.codec.opens].count(first.address) == 1
    # With every talker refusing, the talker's own UNAVAILABLE comes back.
    stack.codec.dead_talkers.add(second.address)
    await pool.probe_all(force=True)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stack.stub.Synthesize(request("nobody left"))
    assert err.value.code() is grpc.StatusCode.UNAVAILABLE and "(from talker)" in (err.value.details() or "")


async def test_talker_not_ready_makes_requests_unavailable(make_stack: MakeStack) -> None:
    talker = FakeTalker()
    stack = await make_stack(talker=talker)
    talker.ready = False
    await stack.gateway.core.talkers.probe_all(force=True)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stack.stub.Synthesize(request("hi"))
    assert err.value.code() is grpc.StatusCode.UNAVAILABLE
    assert "talker" in (err.value.details() or "") and "not ready" in (err.value.details() or "")
    assert stack.codec.opens == []
