"""TLS on the public gRPC and HTTP ports, with a self-signed certificate made at test time (issue 15)."""

from __future__ import annotations

import asyncio
import ssl
from pathlib import Path

import grpc
import httpx
import pytest
from gateway_fakes import expected_samples
from gateway_kit import MakeStack

from tests.tlskit import self_signed
from voxstage import health_probe
from voxstage.client import AsyncSpeechClient, RetryPolicy, SpeechClient, SpeechError


@pytest.fixture
def cert(tmp_path: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 and localhost (skipped without ``openssl``)."""
    return self_signed(tmp_path)


def _tls(cert: tuple[Path, Path]) -> list[str]:
    return [f"gateway.tls_cert_file={cert[0]}", f"gateway.tls_key_file={cert[1]}"]


async def test_grpc_tls_through_the_sdk(make_stack: MakeStack, cert: tuple[Path, Path]) -> None:
    stack = await make_stack(overrides=_tls(cert))
    text = "Over TLS."
    async with AsyncSpeechClient(stack.grpc_addr, root_certificates=cert[0].read_bytes()) as client:
        audio = await client.synthesize(text, encoding="pcm")
        assert len(audio.data) // 2 == expected_samples(text)

    def sync() -> int:
        with SpeechClient(stack.grpc_addr, root_certificates=str(cert[0])) as client:
            return len(client.synthesize(text, encoding="pcm").data) // 2

    assert await asyncio.to_thread(sync) == expected_samples(text)
    # The container healthcheck probes the TLS port when told which certificate to trust.
    probe = ["--addr", stack.grpc_addr, "--timeout", "2"]
    assert await asyncio.to_thread(health_probe.main, [*probe, "--tls-root", str(cert[0])]) == 0
    assert await asyncio.to_thread(health_probe.main, probe) == 1  # plain text cannot probe it
    # Plain text against the TLS port fails, and so does TLS with the system roots (self-signed).
    for options in ({}, {"tls": True}):
        async with AsyncSpeechClient(
            stack.grpc_addr, timeout=3, retry=RetryPolicy(max_attempts=1), **options
        ) as client:
            with pytest.raises(SpeechError) as err:
                await client.synthesize(text)
            assert err.value.code == grpc.StatusCode.UNAVAILABLE


async def test_https(make_stack: MakeStack, cert: tuple[Path, Path]) -> None:
    stack = await make_stack(overrides=_tls(cert))
    url = f"https://127.0.0.1:{stack.gateway.http_port}"
    async with httpx.AsyncClient(base_url=url, verify=ssl.create_default_context(cafile=cert[0])) as http:
        assert (await http.get("/health")).status_code == 200
        r = await http.post("/v1/audio/speech", json={"input": "secure", "response_format": "pcm"})
        assert r.status_code == 200 and len(r.content) // 2 == expected_samples("secure")
    async with httpx.AsyncClient(base_url=stack.http_url) as http:
        with pytest.raises(httpx.HTTPError):
            await http.get("/health")


async def test_tls_with_keys(make_stack: MakeStack, cert: tuple[Path, Path], tmp_path: Path) -> None:
    (tmp_path / "keys").write_text("k1\n")
    stack = await make_stack(overrides=[*_tls(cert), f"gateway.api_keys_file={tmp_path / 'keys'}"])
    async with AsyncSpeechClient(stack.grpc_addr, root_certificates=cert[0], api_key="k1") as client:
        assert await client.list_voices()
    async with AsyncSpeechClient(
        stack.grpc_addr, root_certificates=cert[0], retry=RetryPolicy(max_attempts=1)
    ) as client:
        with pytest.raises(SpeechError) as err:
            await client.list_voices()
        assert err.value.code == grpc.StatusCode.UNAUTHENTICATED
