"""API keys on the public faces, and the switches that hide gRPC reflection and ``/metrics`` (issue 15)."""

from __future__ import annotations

import io
import logging
from pathlib import Path

import grpc
import httpx
import pytest
import soundfile as sf
import websockets
from gateway_fakes import expected_samples
from gateway_kit import MakeStack
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from openai import AsyncOpenAI, AuthenticationError

from gateway.app import reachable_from_elsewhere
from gateway.auth import KeyCheck, SecurityConfigError, load_api_keys
from voxstage.client import AsyncSpeechClient, RetryPolicy, SpeechError
from voxstage.config import ConfigError, load_deploy_config
from voxstage.v1 import speech_pb2

KEY = "vx-test-key-1"
OTHER = "vx-test-key-2"
ENV = "VOXSTAGE_TEST_API_KEYS"


@pytest.fixture
def keys_env(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    monkeypatch.setenv(ENV, f" {KEY} ,{OTHER},")
    return [f"gateway.api_keys_env={ENV}"]


async def _status(stack_http: str, path: str, headers: dict[str, str] | None = None) -> httpx.Response:
    async with httpx.AsyncClient(base_url=stack_http) as http:
        return await http.get(path, headers=headers)


async def test_http_needs_a_key(make_stack: MakeStack, keys_env: list[str]) -> None:
    stack = await make_stack(overrides=keys_env)
    for headers in (None, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
        r = await _status(stack.http_url, "/v1/models", headers)
        assert r.status_code == 401, headers
        assert r.headers["www-authenticate"].startswith("Bearer")
        error = r.json()["error"]
        assert "Authorization: Bearer" in error["message"] and error["code"] == "invalid_api_key"
        assert KEY not in r.text
    async with httpx.AsyncClient(base_url=stack.http_url) as http:
        r = await http.post("/v1/audio/speech", json={"input": "hi", "response_format": "pcm"})
        assert r.status_code == 401
        assert stack.codec.opens == []  # refused before anything reached a stage
    for key in (KEY, OTHER):
        r = await _status(stack.http_url, "/v1/models", {"Authorization": f"bearer {key}"})
        assert r.status_code == 200
    # Open without a key: the probe, and /metrics while gateway.public_metrics stays on.
    assert (await _status(stack.http_url, "/health")).status_code == 200
    assert (await _status(stack.http_url, "/metrics")).status_code == 200


async def test_openai_client_with_api_key(make_stack: MakeStack, keys_env: list[str]) -> None:
    stack = await make_stack(overrides=keys_env)
    text = "The key opens the door."
    wrong = AsyncOpenAI(base_url=f"{stack.http_url}/v1", api_key="wrong", max_retries=0)
    with pytest.raises(AuthenticationError) as err:
        await wrong.audio.speech.create(model="qwen3-tts-tiny", voice="serena", input=text)
    assert err.value.status_code == 401 and "Authorization" in str(err.value)
    await wrong.close()
    client = AsyncOpenAI(base_url=f"{stack.http_url}/v1", api_key=KEY, max_retries=0)
    reply = await client.audio.speech.create(
        model="qwen3-tts-tiny", voice="serena", input=text, response_format="wav"
    )
    pcm, rate = sf.read(io.BytesIO(reply.content), dtype="float32")
    assert rate == 24_000 and len(pcm) == expected_samples(text)
    await client.close()


async def test_realtime_websocket_needs_a_key(make_stack: MakeStack, keys_env: list[str]) -> None:
    stack = await make_stack(overrides=keys_env)
    url = f"ws://127.0.0.1:{stack.gateway.http_port}/v1/realtime?model=qwen3-tts-tiny"
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        with pytest.raises(websockets.InvalidStatus) as refused:
            await websockets.connect(url, additional_headers=headers)
        assert refused.value.response.status_code == 401
    # With the key the session opens (and, on this turn-mode deploy, says why it cannot converse).
    client = AsyncOpenAI(base_url=f"{stack.http_url}/v1", api_key=KEY)
    async with client.realtime.connect(model="qwen3-tts-tiny") as conn:
        event = await conn.recv()
        assert event.type == "error" and event.error.code == "session_mode_not_duplex"


async def test_grpc_needs_a_key(make_stack: MakeStack, keys_env: list[str]) -> None:
    stack = await make_stack(overrides=keys_env)
    request = speech_pb2.SynthesizeRequest(text="hello")
    for metadata in ((), (("authorization", "Bearer wrong"),), (("authorization", KEY),)):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stack.stub.Synthesize(request, metadata=metadata, timeout=5)
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert "authorization: Bearer" in (err.value.details() or "")
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stack.stub.ListVoices(speech_pb2.ListVoicesRequest(), timeout=5)
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert stack.codec.opens == []
    # Health stays open for probes.
    health = health_pb2_grpc.HealthStub(stack.channel)
    reply = await health.Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
    assert reply.status == health_pb2.HealthCheckResponse.SERVING


async def test_sdk_api_key(make_stack: MakeStack, keys_env: list[str]) -> None:
    stack = await make_stack(overrides=keys_env)
    text = "Keyed through the SDK."
    async with AsyncSpeechClient(stack.grpc_addr, retry=RetryPolicy(max_attempts=1)) as client:
        with pytest.raises(SpeechError) as err:
            await client.synthesize(text)
        assert err.value.code == grpc.StatusCode.UNAUTHENTICATED
    async with AsyncSpeechClient(stack.grpc_addr, api_key="wrong") as client:
        with pytest.raises(SpeechError) as err:
            await client.list_voices()
        assert err.value.code == grpc.StatusCode.UNAUTHENTICATED
    async with AsyncSpeechClient(stack.grpc_addr, api_key=KEY) as client:
        audio = await client.synthesize(text, encoding="pcm")
        assert len(audio.data) // 2 == expected_samples(text)
        chunks = [chunk async for chunk in client.stream(text, encoding="pcm")]
        assert sum(len(c.data) for c in chunks) // 2 == expected_samples(text)
        assert [v.name for v in await client.list_voices()][:1] == ["serena"]


async def test_keys_from_a_file(make_stack: MakeStack, tmp_path: Path) -> None:
    path = tmp_path / "keys"
    path.write_text(f"# operators\n{KEY}  # the first\n\n{OTHER}\n")
    stack = await make_stack(overrides=[f"gateway.api_keys_file={path}"])
    assert (await _status(stack.http_url, "/v1/models")).status_code == 401
    ok = await _status(stack.http_url, "/v1/models", {"Authorization": f"Bearer {OTHER}"})
    assert ok.status_code == 200


async def test_off_by_default_and_switches(make_stack: MakeStack) -> None:
    stack = await make_stack()
    assert (await _status(stack.http_url, "/v1/models")).status_code == 200
    reply = await stack.stub.ListVoices(speech_pb2.ListVoicesRequest(), timeout=5)
    assert reply.voices
    hidden = await make_stack(overrides=["gateway.reflection=false", "gateway.public_metrics=false"])
    r = await _status(hidden.http_url, "/metrics")
    assert r.status_code == 404 and "gateway.public_metrics" in r.json()["error"]["message"]
    assert (await _status(hidden.http_url, "/health")).status_code == 200
    request = reflection_pb2.ServerReflectionRequest(list_services="")
    call = reflection_pb2_grpc.ServerReflectionStub(stack.channel).ServerReflectionInfo(iter([request]))
    answer = await call.read()
    assert "voxstage.v1.Speech" in [s.name for s in answer.list_services_response.service]
    # No request is sent to the hidden service: the server refuses the method from its headers, and a
    # request written while that refusal arrives races it (grpc then reports INTERNAL, not the status).
    refused = reflection_pb2_grpc.ServerReflectionStub(hidden.channel).ServerReflectionInfo(timeout=5)
    assert await refused.code() == grpc.StatusCode.UNIMPLEMENTED


async def test_metrics_need_the_key_when_not_public(make_stack: MakeStack, keys_env: list[str]) -> None:
    """Issue 26, defect 7: ``public_metrics: false`` with keys on means "only with a key"
    (docs/operations.md), not hidden from a valid key too (it answered 404 to everyone)."""
    stack = await make_stack(overrides=[*keys_env, "gateway.public_metrics=false"])
    assert (await _status(stack.http_url, "/metrics")).status_code == 401
    with_key = await _status(stack.http_url, "/metrics", {"Authorization": f"Bearer {KEY}"})
    assert with_key.status_code == 200 and "voxstage_" in with_key.text


def test_key_check_and_loading(tmp_path: Path) -> None:
    check = KeyCheck((KEY.encode(),))
    assert check.allows(f"Bearer {KEY}") and check.allows(f"bearer  {KEY} ".encode())
    assert not check.allows(None) and not check.allows(KEY) and not check.allows(f"Bearer {KEY}x")
    assert not check.allows("Basic abc") and KeyCheck(()).allows(None)
    config = load_deploy_config(
        Path(__file__).resolve().parents[3] / "deploy" / "qwen3_tts.yaml",
        platform="cpu",
        overrides=[f"gateway.api_keys_env={ENV}", f"gateway.api_keys_file={tmp_path / 'none'}"],
    )
    with pytest.raises(SecurityConfigError, match="gateway.api_keys_file"):
        load_api_keys(config.gateway, {ENV: KEY})
    (tmp_path / "none").write_text("# nothing yet\n")
    with pytest.raises(SecurityConfigError, match="holds no key"):
        load_api_keys(config.gateway, {ENV: KEY})
    (tmp_path / "none").write_text("a\n")
    with pytest.raises(SecurityConfigError, match=ENV):
        load_api_keys(config.gateway, {ENV: " , "})
    assert load_api_keys(config.gateway, {ENV: f"{KEY},a"}) == (b"a", KEY.encode())


def test_tls_needs_both_files() -> None:
    seed = Path(__file__).resolve().parents[3] / "deploy" / "qwen3_tts.yaml"
    for given, missing in (("tls_cert_file", "tls_key_file"), ("tls_key_file", "tls_cert_file")):
        with pytest.raises(ConfigError, match=f"gateway.{missing}"):
            load_deploy_config(seed, platform="cpu", overrides=[f"gateway.{given}=/x.pem"])


async def test_an_open_gateway_without_keys_says_so_once_at_start(
    make_stack: MakeStack, keys_env: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 29: a public face on a non-loopback address with no API keys logs one clear warning."""
    caplog.set_level(logging.WARNING, logger="gateway.app")

    def warnings() -> list[str]:
        found = [r.getMessage() for r in caplog.records if "no API keys" in r.getMessage()]
        caplog.clear()
        return found

    stack = await make_stack(host="0.0.0.0")
    (line,) = warnings()
    assert "0.0.0.0" in line and f":{stack.gateway.http_port}" in line and "gateway.api_keys_file" in line
    await make_stack()  # loopback only: nobody else can reach it
    await make_stack(host="0.0.0.0", overrides=keys_env)  # keys: nothing to warn about
    assert warnings() == []
    assert not any(map(reachable_from_elsewhere, ("127.0.0.1", "::1", "localhost", "127.0.0.2")))
    assert all(map(reachable_from_elsewhere, ("0.0.0.0", "::", "[::]", "10.0.0.5", "gw.internal")))
