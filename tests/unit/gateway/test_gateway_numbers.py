"""Numbers a client and an operator read: unary ``Synthesize`` reports its real time to first audio, and a
call ended by its deadline counts (and logs) as ``deadline_exceeded`` with its code, on gRPC and HTTP."""

from __future__ import annotations

import logging
import re

import grpc
import httpx
import pytest
from gateway_fakes import FakeCodec
from gateway_kit import MakeStack, until

from voxstage import metrics
from voxstage.v1 import speech_pb2

PCM = speech_pb2.AUDIO_ENCODING_PCM_S16LE


def outcomes(name: str) -> float:
    return metrics.REGISTRY.get_sample_value("voxstage_requests_total", {"outcome": name}) or 0.0


def access_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "voxstage.gateway.access"]


async def test_unary_synthesize_reports_its_time_to_first_audio(make_stack: MakeStack) -> None:
    stack = await make_stack(FakeCodec(frame_delay_s=0.02))
    config = speech_pb2.SynthesisConfig(encoding=PCM)
    config.chunk_schedule.initial_chunk_frames = 1
    config.chunk_schedule.steady_chunk_frames = 4
    reply = await stack.stub.Synthesize(speech_pb2.SynthesizeRequest(config=config, text="abcdefghijkl"))
    ttfa = reply.summary.time_to_first_audio.ToNanoseconds() / 1e9
    total = reply.summary.total_duration.ToNanoseconds() / 1e9
    assert 0.015 < ttfa < total - 0.1, (ttfa, total)  # one frame's delay, well before the 12 frames' end


async def test_a_grpc_deadline_is_deadline_exceeded(
    make_stack: MakeStack, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="voxstage.gateway.access")
    stack = await make_stack(FakeCodec(frame_delay_s=0.1))
    before = {name: outcomes(name) for name in ("cancelled", "deadline_exceeded")}
    with pytest.raises(grpc.aio.AioRpcError) as err:
        config = speech_pb2.SynthesisConfig(encoding=PCM)
        await stack.stub.Synthesize(speech_pb2.SynthesizeRequest(config=config, text="x" * 40), timeout=0.4)
    assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    await until(lambda: outcomes("deadline_exceeded") > before["deadline_exceeded"])
    assert outcomes("cancelled") == before["cancelled"]
    line = access_lines(caplog)[-1]
    assert re.search(r"grpc_synthesize .* outcome=deadline_exceeded .* code=DEADLINE_EXCEEDED$", line), line
    assert re.match(r"request id=[0-9a-f]{32} ", line), line


async def test_an_http_lifetime_limit_is_deadline_exceeded(
    make_stack: MakeStack, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="voxstage.gateway.access")
    stack = await make_stack(FakeCodec(frame_delay_s=0.1), overrides=["gateway.max_stream_lifetime_s=0.5"])
    before = {name: outcomes(name) for name in ("cancelled", "deadline_exceeded")}
    async with httpx.AsyncClient(base_url=stack.http_url) as http:
        r = await http.post("/v1/audio/speech", json={"input": "x" * 40, "stream": False})
    assert r.status_code == 504
    await until(lambda: outcomes("deadline_exceeded") > before["deadline_exceeded"])
    assert outcomes("cancelled") == before["cancelled"]
    assert "outcome=deadline_exceeded" in access_lines(caplog)[-1]


async def test_a_refusal_logs_its_code(make_stack: MakeStack, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="voxstage.gateway.access")
    stack = await make_stack()
    async with httpx.AsyncClient(base_url=stack.http_url) as http:
        r = await http.post("/v1/audio/speech", json={"input": "hi", "voice": "nobody"})
    assert r.status_code == 404
    assert re.search(r"outcome=invalid .* code=NOT_FOUND$", access_lines(caplog)[-1])
