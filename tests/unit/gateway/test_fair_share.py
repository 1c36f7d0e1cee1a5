"""Fair sharing between clients (issue 26, gateway/quotas.py): limits per API key from the key file, per
connection when keys are off, refused with RESOURCE_EXHAUSTED / 429 and a retry hint, while other clients
are served."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import httpx
import pytest
from gateway_fakes import FakeCodec
from gateway_kit import MakeStack, until

from gateway.auth import SecurityConfigError, load_key_limits
from gateway.quotas import SESSION, STREAM, ClientLimits, LimitsError, Quotas, parse_key_options
from voxstage.config import load_deploy_config
from voxstage.v1 import speech_pb2, speech_pb2_grpc

PCM = speech_pb2.AUDIO_ENCODING_PCM_S16LE
SEED = Path(__file__).resolve().parents[3] / "deploy" / "qwen3_tts.yaml"


def request(text: str = "hello") -> speech_pb2.SynthesizeRequest:
    return speech_pb2.SynthesizeRequest(config=speech_pb2.SynthesisConfig(encoding=PCM), text=text)


def test_key_file_options() -> None:
    assert parse_key_options([]) == ClientLimits()
    limits = parse_key_options(["streams=2", "sessions=1", "rate=30/min", "name=team-a"])
    assert limits == ClientLimits(streams=2, sessions=1, rate=0.5, name="team-a")
    for bad, why in (("streams=0", ">= 1"), ("rate=fast", "per s, min or h"), ("colour=red", "unknown"),
                     ("streams", "an option after a key")):  # fmt: skip
        with pytest.raises(LimitsError, match=why):
            parse_key_options([bad])


def test_key_file_is_read_with_its_limits_and_a_bad_line_names_its_number(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    keys.write_text("# team keys\nalpha streams=1 rate=2/s name=alpha\nbeta\n")
    config = load_deploy_config(SEED, platform="cpu", overrides=[f"gateway.api_keys_file={keys}"])
    limits = load_key_limits(config.gateway)
    assert limits == {b"alpha": ClientLimits(streams=1, rate=2.0, name="alpha"), b"beta": ClientLimits()}
    keys.write_text("alpha streams=1\nbeta stream=2\n")
    with pytest.raises(SecurityConfigError, match="key 2: stream: unknown option") as err:
        load_key_limits(config.gateway)
    assert "beta" not in str(err.value)  # a key is never named


def test_rate_is_a_token_bucket_and_the_hint_says_when() -> None:
    now = [0.0]
    quotas = Quotas(per_connection=ClientLimits(rate=2.0), clock=lambda: now[0])
    quotas.acquire(None, "a", STREAM)()
    quotas.acquire(None, "a", STREAM)()  # a burst of two
    with pytest.raises(Exception) as err:
        quotas.acquire(None, "a", STREAM)
    assert err.value.code is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert err.value.retry_after_s == pytest.approx(0.5)
    quotas.acquire(None, "b", SESSION)()  # another connection has its own bucket
    now[0] = 0.5
    quotas.acquire(None, "a", STREAM)()


async def test_a_key_at_its_stream_limit_is_refused_while_another_key_is_served(
    make_stack: MakeStack, tmp_path: Path
) -> None:
    keys = tmp_path / "keys"
    keys.write_text("busy-key streams=1 name=busy\nfree-key\n")
    stack = await make_stack(FakeCodec(frame_delay_s=0.05), overrides=[f"gateway.api_keys_file={keys}"])
    stub = speech_pb2_grpc.SpeechStub(stack.channel)
    busy = (("authorization", "Bearer busy-key"),)
    first = asyncio.ensure_future(stub.Synthesize(request("a long sentence " * 3), metadata=busy, timeout=20))
    await until(lambda: stack.codec.active == 1)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.Synthesize(request(), metadata=busy, timeout=5)
    assert err.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "API key busy: 1 streams open, its limit of 1" in (err.value.details() or "")
    assert "busy-key" not in (err.value.details() or "")
    retry = dict(err.value.trailing_metadata() or ()).get("grpc-status-details-bin")
    assert retry is not None  # RetryInfo: the SDK may retry it
    other = await stub.Synthesize(request(), metadata=(("authorization", "Bearer free-key"),), timeout=20)
    assert other.audio
    async with httpx.AsyncClient(base_url=stack.http_url, timeout=10) as http:
        body = {"input": "hi", "response_format": "pcm", "stream": False}
        r = await http.post("/v1/audio/speech", json=body, headers={"Authorization": "Bearer busy-key"})
        assert r.status_code == 429 and r.headers["retry-after"] == "1"
        assert r.json()["error"]["code"] == "client_limit_reached"
    await first
    again = await stub.Synthesize(request(), metadata=busy, timeout=20)
    assert again.audio


async def test_per_connection_limits_when_keys_are_off(make_stack: MakeStack) -> None:
    stack = await make_stack(FakeCodec(frame_delay_s=0.05), overrides=["gateway.connection_max_streams=1"])
    stub = speech_pb2_grpc.SpeechStub(stack.channel)
    first = asyncio.ensure_future(stub.Synthesize(request("a long sentence " * 3), timeout=20))
    await until(lambda: stack.codec.active == 1)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.Synthesize(request(), timeout=5)
    assert err.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "gateway.connection_max_streams" in (err.value.details() or "")
    # Another connection is another client (its own subchannel: channels of a process share one otherwise).
    own = [("grpc.use_local_subchannel_pool", 1)]
    async with grpc.aio.insecure_channel(stack.grpc_addr, options=own) as other:
        reply = await speech_pb2_grpc.SpeechStub(other).Synthesize(request(), timeout=20)
        assert reply.audio
    await first
