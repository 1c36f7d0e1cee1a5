"""Routing across replicas: least-loaded choice, failover, fail-fast on a dead stage, recovery."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import grpc
import pytest
from gateway_fakes import FakeCodec, FakeTalker, expected_samples, start_codec
from gateway_kit import MakeStack
from grpc.aio import Metadata

from gateway.errors import GatewayError
from gateway.routing import Replica, ReplicaPool, open_on_pair, parse_addresses
from voxstage.internal.v1 import stage_pb2
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


async def test_codec_unavailable_for_a_dead_talker_moves_to_another_talker() -> None:
    # A real codec that cannot reach its talker answers UNAVAILABLE with origin "codec" ("talker X is
    # unreachable"). In the moment after a talker dies, before any probe saw it, that used to exclude the
    # healthy codec and then fail the request on the next codec with the same dead talker.
    dead = "127.0.0.1:21"

    async def status(replica: Replica) -> stage_pb2.StageStatus:
        if replica.address == dead and killed:
            raise grpc.aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, Metadata(), Metadata(), "refused")
        return stage_pb2.StageStatus(ready=True)

    killed = False
    codecs = ReplicaPool("codec", ["127.0.0.1:11", "127.0.0.1:12"], status)
    talkers = ReplicaPool("talker", [dead, "127.0.0.1:22"], status)
    await asyncio.gather(codecs.probe_all(force=True), talkers.probe_all(force=True))
    killed = True  # the talker dies; nothing has probed it since
    tried: list[tuple[str, str]] = []

    async def attempt(codec: Replica, talker: Replica) -> str:
        tried.append((codec.address, talker.address))
        if talker.address == dead:
            msg = f"talker {dead} is unreachable: UNAVAILABLE: connection refused (from codec)"
            raise GatewayError(grpc.StatusCode.UNAVAILABLE, msg, reason="codec_unavailable")
        return "opened"

    try:
        for _ in range(4):
            codec, talker, _opened = await open_on_pair(codecs, talkers, attempt)
            assert talker.address != dead
            codec.in_flight -= 1
            talker.in_flight -= 1
        assert [t for _, t in tried].count(dead) == 1, tried  # the first pick, then never again
        assert talkers.replicas[0].down and not any(r.down for r in codecs.replicas)
    finally:
        await asyncio.gather(codecs.close(), talkers.close())
