"""The gateway's stage channels under mutual TLS (``gateway.link_*``), against stage doubles whose ports
require a client certificate from the links' CA (issue 15). The real stages, the codec's own talker channel
and ``voxstage serve`` are covered by tests/integration/test_stage_mtls.py."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from gateway_fakes import FakeCodec, FakeTalker, expected_samples
from gateway_kit import SEED, until

from gateway.app import GatewayServer
from tests.tlskit import authority
from voxstage.client import AsyncSpeechClient, RetryPolicy, SpeechError
from voxstage.config import load_deploy_config
from voxstage.internal.v1 import stage_pb2_grpc
from voxstage.stage.tls import load_link_tls


async def _double(
    add: object, servicer: object, credentials: grpc.ServerCredentials
) -> tuple[grpc.aio.Server, str]:
    server = grpc.aio.server()
    add(servicer, server)
    port = server.add_secure_port("127.0.0.1:0", credentials)
    await server.start()
    return server, f"127.0.0.1:{port}"


@pytest.mark.usefixtures("cache")
async def test_the_gateway_reaches_mtls_stages_only_with_its_certificate(tmp_path: Path) -> None:
    ca = authority(tmp_path / "pki")
    stage_leaf, gateway_leaf = ca.issue("stage", "DNS:voxstage-stage"), ca.issue("gateway")
    stage_tls = load_link_tls(str(ca.cert), str(stage_leaf.cert), str(stage_leaf.key))
    assert stage_tls is not None
    creds = stage_tls.server_credentials()
    codec, codec_addr = await _double(stage_pb2_grpc.add_CodecServicer_to_server, FakeCodec(), creds)
    talker, talker_addr = await _double(stage_pb2_grpc.add_TalkerServicer_to_server, FakeTalker(), creds)
    files = {"ca_file": ca.cert, "cert_file": gateway_leaf.cert, "key_file": gateway_leaf.key}
    keys = [f"gateway.link_{k}={v}" for k, v in files.items()] + ["gateway.link_server_name=voxstage-stage"]
    gateways: list[GatewayServer] = []
    try:
        for overrides in (keys, []):
            config = load_deploy_config(SEED, platform="cpu", overrides=overrides)
            ports = {"grpc_port": 0, "http_port": 0}
            gw = GatewayServer(config, [codec_addr], [talker_addr], host="127.0.0.1", grace_s=1.0, **ports)
            gw.core.probe_interval_s = 0.2
            gateways.append(gw)
            await gw.start()
        secure, plain = gateways
        await until(lambda: secure.core.ready)
        text = "Across the stage links."
        async with AsyncSpeechClient(f"127.0.0.1:{secure.grpc_port}") as client:
            audio = await client.synthesize(text, encoding="pcm")
        assert len(audio.data) // 2 == expected_samples(text)
        # The same gateway without the link keys speaks plain gRPC: every stage refuses its handshake.
        assert not plain.core.ready and plain.core.codecs.replicas[0].down
        async with AsyncSpeechClient(
            f"127.0.0.1:{plain.grpc_port}", timeout=3, retry=RetryPolicy(max_attempts=1)
        ) as client:
            with pytest.raises(SpeechError) as err:
                await client.synthesize(text)
        assert err.value.code == grpc.StatusCode.UNAVAILABLE
    finally:
        for gw in gateways:
            await gw.stop()
        await codec.stop(0)
        await talker.stop(0)
