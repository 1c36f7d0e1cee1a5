"""Mutual TLS on the stage links (issue 15): a stage port with ``--link-*`` serves only clients holding a
certificate from its CA, and an incomplete set of files is refused naming what is missing, on every front
end (stage and launcher flags, the gateway's deploy keys, the health probe)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from gateway.auth import SecurityConfigError, read_link_tls
from tests.tlskit import Authority, Leaf, authority
from voxstage import health_probe
from voxstage.config import ConfigError, load_deploy_config
from voxstage.server import StageServer, start_stage_server
from voxstage.stage.tls import LinkTls, LinkTlsError, aio_channel, load_link_tls

ROOT = Path(__file__).resolve().parents[2]
SEED = ROOT / "deploy" / "qwen3_tts.yaml"
CHECK = health_pb2.HealthCheckRequest()


@pytest.fixture
def pki(tmp_path: Path) -> tuple[Authority, Authority]:
    """Our CA, and another one whose certificates must not get in."""
    return authority(tmp_path / "ours"), authority(tmp_path / "theirs", "rogue-ca")


def _tls(ca: Authority, leaf: Leaf, server_name: str | None = None) -> LinkTls:
    tls = load_link_tls(str(ca.cert), str(leaf.cert), str(leaf.key), server_name)
    assert tls is not None
    return tls


@pytest.fixture
async def stage(pki: tuple[Authority, Authority]) -> AsyncIterator[StageServer]:
    ours, _ = pki
    # Issued to a service name only: clients must check it with the server-name override.
    server = _tls(ours, ours.issue("stage", "DNS:voxstage-stage"))
    stage = await start_stage_server([], host="127.0.0.1", credentials=server.server_credentials())
    await stage.set_ready()
    yield stage
    await stage.server.stop(0)


async def _health(address: str, credentials: grpc.ChannelCredentials | None, **options: str) -> str:
    """SERVING, or the status code the call failed with."""
    opts = [(f"grpc.{k}", v) for k, v in options.items()]
    channel = (
        grpc.aio.insecure_channel(address)
        if credentials is None
        else grpc.aio.secure_channel(address, credentials, options=opts)
    )
    async with channel:
        try:
            reply = await health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=3
            )
        except grpc.aio.AioRpcError as exc:
            return exc.code().name
    return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)


async def test_only_a_certificate_from_the_links_ca_gets_in(
    stage: StageServer, pki: tuple[Authority, Authority]
) -> None:
    ours, theirs = pki
    address = f"127.0.0.1:{stage.port}"
    name = {"ssl_target_name_override": "voxstage-stage"}
    good = _tls(ours, ours.issue("gateway"), "voxstage-stage")
    async with aio_channel(address, (), good) as channel:
        reply = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=3)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
    # Plain text, TLS without a client certificate, and a certificate another CA signed: the handshake fails.
    assert await _health(address, None) == "UNAVAILABLE"
    anonymous = grpc.ssl_channel_credentials(root_certificates=ours.cert.read_bytes())
    assert await _health(address, anonymous, **name) == "UNAVAILABLE"
    rogue = theirs.issue("rogue")
    forged = grpc.ssl_channel_credentials(
        ours.cert.read_bytes(), rogue.key.read_bytes(), rogue.cert.read_bytes()
    )
    assert await _health(address, forged, **name) == "UNAVAILABLE"
    # Our certificate, but the stage's is checked against the host in the address without the override.
    assert await _health(address, _tls(ours, ours.issue("gateway2")).channel_credentials()) == "UNAVAILABLE"
    # The container healthcheck presents the link certificate; without it a mTLS stage reads as down.
    leaf = ours.issue("probe")
    flags = ["--addr", address, "--timeout", "3", "--link-ca", str(ours.cert), "--link-cert", str(leaf.cert)]
    flags += ["--link-key", str(leaf.key)]
    assert await asyncio.to_thread(health_probe.main, [*flags, "--link-server-name", "voxstage-stage"]) == 0
    assert await asyncio.to_thread(health_probe.main, flags) == 1  # no override: the name does not match
    assert await asyncio.to_thread(health_probe.main, ["--addr", address, "--timeout", "3"]) == 1


def test_incomplete_sets_are_refused_naming_what_is_missing(
    pki: tuple[Authority, Authority], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ours, _ = pki
    leaf = ours.issue("stage")
    ca, cert, key = str(ours.cert), str(leaf.cert), str(leaf.key)
    assert load_link_tls(None, None, None) is None  # off by default
    with pytest.raises(LinkTlsError, match=r"--link-cert is set but --link-ca, --link-key are not"):
        load_link_tls(None, cert, None)
    with pytest.raises(LinkTlsError, match=r"--link-ca, --link-cert are set but --link-key is not"):
        load_link_tls(ca, cert, None)
    with pytest.raises(LinkTlsError, match=r"--link-server-name is set but mTLS on the stage links is off"):
        load_link_tls(None, None, None, "voxstage-stage")
    with pytest.raises(LinkTlsError, match=r"--link-key: cannot read .*missing\.pem"):
        load_link_tls(ca, cert, str(tmp_path / "missing.pem"))
    (tmp_path / "junk.pem").write_text("not a certificate\n")
    with pytest.raises(LinkTlsError, match=r"--link-ca: .*junk\.pem holds no PEM block"):
        load_link_tls(str(tmp_path / "junk.pem"), cert, key)
    # The gateway's deploy keys: the set is checked with the file, the files when the gateway starts.
    with pytest.raises(ConfigError, match=r"gateway\.link_ca_file, gateway\.link_key_file not set"):
        load_deploy_config(SEED, platform="cpu", overrides=[f"gateway.link_cert_file={cert}"])
    with pytest.raises(ConfigError, match=r"gateway\.link_server_name is set but mTLS"):
        load_deploy_config(SEED, platform="cpu", overrides=["gateway.link_server_name=x"])
    keys = [f"gateway.link_ca_file={tmp_path / 'nope.pem'}", f"gateway.link_cert_file={cert}"]
    config = load_deploy_config(SEED, platform="cpu", overrides=[*keys, f"gateway.link_key_file={key}"])
    with pytest.raises(SecurityConfigError, match=r"gateway\.link_ca_file: cannot read .*nope\.pem"):
        read_link_tls(config.gateway)
    # The health probe is a usage error (exit 2), never a silent NOT_SERVING.
    with pytest.raises(SystemExit) as exited:
        health_probe.main(["--addr", "127.0.0.1:1", "--link-key", key])
    assert exited.value.code == 2 and "--link-ca, --link-cert are not" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("command", "flags", "missing"),
    [
        (["talker", "--config", str(SEED)], ["--link-cert", "C"], "--link-ca, --link-key are not"),
        (["codec", "--config", str(SEED)], ["--link-server-name", "x"], "--link-server-name is set but"),
        (["serve", str(SEED), "--model", "qwen3-tts-tiny"], ["--link-ca", "C"], "--link-cert, --link-key"),
    ],
)
def test_processes_refuse_an_incomplete_set_before_loading_anything(
    command: list[str], flags: list[str], missing: str, tmp_path: Path
) -> None:
    (tmp_path / "C").write_text("-----BEGIN CERTIFICATE-----\n")
    done = subprocess.run(
        [sys.executable, "-m", "voxstage", *command, *flags],
        capture_output=True, text=True, timeout=60, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert missing in done.stderr, done.stderr
