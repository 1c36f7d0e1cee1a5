"""Health watch (issue 15, part 2): the gateway sees a stage leave and come back within a second.

Fake stage servers are stopped and restarted on the same port. The periodic probe is mostly set to 5 s, so
only the watch (channel connectivity, fast re-probes of a down replica, short reconnect back-off) can make
the bounds. Readiness stays honest throughout: ``/health``'s ``status`` always agrees with its
``codec_ready`` / ``talker_ready`` and its HTTP code, and gRPC health follows within the same bound.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import grpc
import httpx
import pytest
from gateway_fakes import FakeCodec, expected_samples, start_codec
from gateway_kit import MakeStack, Stack
from grpc_health.v1 import health_pb2, health_pb2_grpc

from voxstage.internal.v1 import stage_pb2_grpc
from voxstage.v1 import speech_pb2

PCM = speech_pb2.AUDIO_ENCODING_PCM_S16LE
BOUND_S = 1.0
SERVING = health_pb2.HealthCheckResponse.SERVING


def request(text: str) -> speech_pb2.SynthesizeRequest:
    return speech_pb2.SynthesizeRequest(config=speech_pb2.SynthesisConfig(encoding=PCM), text=text)


async def seconds_until(condition: Callable[[], bool], limit_s: float = 10.0) -> float:
    start = time.monotonic()
    while not condition():
        assert time.monotonic() - start < limit_s, "condition not reached in time"
        await asyncio.sleep(0.01)
    return time.monotonic() - start


class HealthPoller:
    """Reads ``/health`` and the gateway's gRPC health every 10 ms and checks each answer is coherent."""

    def __init__(self, stack: Stack) -> None:
        self.stack = stack
        self.last: dict[str, Any] = {}
        self.grpc_serving: bool | None = None
        self.incoherent: list[dict[str, Any]] = []
        self.task = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        health = health_pb2_grpc.HealthStub(self.stack.channel)
        async with httpx.AsyncClient(base_url=self.stack.http_url) as http:
            while True:
                r = await http.get("/health")
                body = r.json()
                ok = body["codec_ready"] and body["talker_ready"] and not body["draining"]
                if (body["status"] == "ok") != ok or (r.status_code == 200) != ok:
                    self.incoherent.append({"http": r.status_code, **body})
                self.last = {"http": r.status_code, **body}
                reply = await health.Check(health_pb2.HealthCheckRequest(service=""), timeout=1.0)
                self.grpc_serving = reply.status == SERVING
                await asyncio.sleep(0.01)

    def ready(self) -> bool:
        return self.last.get("http") == 200 and self.grpc_serving is True

    def unready(self) -> bool:
        return self.last.get("http") == 503 and self.grpc_serving is False

    async def stop(self) -> None:
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)


# 5 s: only the watch can notice in time; 0.2 s: a fast periodic probe alone must not be what saves it
# (the return after a long outage, and /health's coherence, do not depend on it).
@pytest.mark.parametrize("probe_s", [5.0, 0.2])
async def test_codec_death_and_return_are_seen_within_a_second(make_stack: MakeStack, probe_s: float) -> None:
    stack = await make_stack(probe_s=probe_s)
    poller = HealthPoller(stack)
    try:
        await seconds_until(poller.ready)
        pool = stack.gateway.core.codecs
        port = stack.codecs[0].port
        await stack.codecs[0].server.stop(0)
        noticed = await seconds_until(lambda: pool.replicas[0].down)
        unready = await seconds_until(poller.unready)
        assert noticed < BOUND_S and noticed + unready < BOUND_S, (noticed, unready)
        assert poller.last["codec_ready"] is False and poller.last["status"] == "unavailable"
        # A long outage: the old schedule (0.5 s doubling, plus gRPC's own reconnect back-off) would now
        # wait seconds before looking again.
        await asyncio.sleep(3.0)
        revived = await start_codec(FakeCodec(), port=port)
        stack.codecs.append(revived)
        back = await seconds_until(lambda: not pool.replicas[0].down)
        ready = await seconds_until(poller.ready)
        assert back < BOUND_S and back + ready < BOUND_S, (back, ready)
        reply = await stack.stub.Synthesize(request("welcome back"))
        assert len(reply.audio) == 2 * expected_samples("welcome back")
        print(
            f"codec down seen in {noticed:.3f} s (not ready {noticed + unready:.3f} s), "
            f"back in {back:.3f} s (ready {back + ready:.3f} s)"
        )
    finally:
        await poller.stop()
    assert poller.incoherent == []


async def test_health_reports_not_ready_the_moment_no_codec_is_routable(make_stack: MakeStack) -> None:
    stack = await make_stack(probe_s=5.0)
    pool = stack.gateway.core.codecs
    health = health_pb2_grpc.HealthStub(stack.channel)
    async with httpx.AsyncClient(base_url=stack.http_url) as http:
        assert (await http.get("/health")).status_code == 200
        pool.mark_down(pool.replicas[0], "test: connection refused")
        r = await http.get("/health")  # no probe, no sleep: readiness is derived, not a stale snapshot
        assert (r.status_code, r.json()["status"], r.json()["codec_ready"]) == (503, "unavailable", False)
        await asyncio.sleep(0.05)  # gRPC health follows the pool's change event, not a 0.5 s timer
        reply = await health.Check(health_pb2.HealthCheckRequest(service=""), timeout=1.0)
        assert reply.status == health_pb2.HealthCheckResponse.NOT_SERVING
        await pool.probe(pool.replicas[0])  # the codec is in fact fine: the probe brings it back
        r = await http.get("/health")
        assert (r.status_code, r.json()["status"], r.json()["codec_ready"]) == (200, "ok", True)
        await asyncio.sleep(0.05)
        reply = await health.Check(health_pb2.HealthCheckRequest(service=""), timeout=1.0)
        assert reply.status == SERVING


async def test_talker_death_and_return_are_seen_within_a_second(make_stack: MakeStack) -> None:
    stack = await make_stack(probe_s=5.0)
    pool = stack.gateway.core.talkers
    talker = stack.talkers[0]
    await talker.server.stop(0)
    noticed = await seconds_until(lambda: pool.replicas[0].down)
    assert noticed < BOUND_S and not stack.gateway.core.ready
    await asyncio.sleep(2.0)
    # The same servicer on the same port, as a restarted talker process would be.
    server = grpc.aio.server()
    stage_pb2_grpc.add_TalkerServicer_to_server(talker.servicer, server)
    assert server.add_insecure_port(talker.address) == talker.port
    await server.start()
    try:
        back = await seconds_until(lambda: not pool.replicas[0].down)
        assert back < BOUND_S and stack.gateway.core.ready
        reply = await stack.stub.Synthesize(request("talker is back"))
        assert len(reply.audio) == 2 * expected_samples("talker is back")
    finally:
        await server.stop(0)


async def test_in_flight_request_on_a_dead_codec_gets_unavailable_within_a_second(
    make_stack: MakeStack,
) -> None:
    stack = await make_stack(FakeCodec(frame_delay_s=0.02), probe_s=5.0)

    async def inputs() -> Any:
        config = speech_pb2.SynthesisConfig(encoding=PCM)
        yield speech_pb2.StreamingSynthesizeRequest(config=config)
        yield speech_pb2.StreamingSynthesizeRequest(text="a long text that keeps the codec busy " * 4)

    call = stack.stub.StreamingSynthesize(inputs())
    async for msg in call:
        if msg.HasField("audio"):
            break
    start = time.monotonic()
    await stack.codecs[0].server.stop(0)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        async for _ in call:
            pass
    assert err.value.code() is grpc.StatusCode.UNAVAILABLE
    assert time.monotonic() - start < BOUND_S
    assert stack.gateway.core.codecs.replicas[0].down
