"""``voxstage serve --link-*``: mutual TLS on every stage link of real talker, codec and gateway processes
(issue 15). A request through the gateway crosses gateway -> codec and codec -> talker, both of which only
a certificate from the links' CA can open; the stage ports refuse plain text and certificates of another
CA."""

from __future__ import annotations

import time
from pathlib import Path

import grpc
import numpy as np
import pytest

from tests.integration.test_serve import cache, free_port, serve  # noqa: F401 - cache is a fixture
from tests.tlskit import authority
from voxstage.health_probe import check
from voxstage.internal.v1 import stage_pb2, stage_pb2_grpc
from voxstage.stage.tls import load_link_tls

pytestmark = pytest.mark.timeout(150)
FRAMES = 12
NAME = "voxstage-stage"  # the stages' certificate names only this: every dial needs --link-server-name


def _status(address: str, credentials: grpc.ChannelCredentials | None) -> str:
    options = [("grpc.ssl_target_name_override", NAME)]
    channel = (
        grpc.insecure_channel(address)
        if credentials is None
        else grpc.secure_channel(address, credentials, options=options)
    )
    with channel:
        try:
            reply = stage_pb2_grpc.TalkerStub(channel).Status(stage_pb2.TalkerStatusRequest(), timeout=5)
        except grpc.RpcError as exc:
            return exc.code().name  # type: ignore[attr-defined, no-any-return]
    return "ready" if reply.status.ready else "not ready"


def test_serve_with_mtls_stage_links(cache: Path, tmp_path: Path) -> None:  # noqa: F811
    from voxstage.client import SpeechClient

    ours, theirs = authority(tmp_path / "ours"), authority(tmp_path / "theirs", "rogue-ca")
    leaf = ours.issue("stages", f"DNS:{NAME}")
    link = ["--link-ca", str(ours.cert), "--link-cert", str(leaf.cert), "--link-key", str(leaf.key)]
    grpc_port, talker_port, codec_port = free_port(), free_port(), free_port()
    log = tmp_path / "serve.log"
    proc = serve(
        cache, log, *link, "--link-server-name", NAME,
        "--grpc-port", str(grpc_port), "--http-port", str(free_port()), "--host", "127.0.0.1",
        "--talker-port", str(talker_port), "--codec-port", str(codec_port),
        "--set", f"stages.0.default_sampling_params.max_tokens={FRAMES}",
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not check(f"127.0.0.1:{grpc_port}", timeout=1.0):
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.2)
        with SpeechClient(f"127.0.0.1:{grpc_port}", timeout=60) as client:
            audio = client.synthesize("over mutual TLS", encoding="pcm_f32", voice="ryan", seed=7)
        samples = audio.to_numpy()
        assert samples.size == FRAMES * 1920 and float(np.std(samples)) > 0.01, log.read_text()[-3000:]
        tls = load_link_tls(str(ours.cert), str(leaf.cert), str(leaf.key), NAME)
        assert tls is not None
        rogue = theirs.issue("rogue", f"DNS:{NAME}")
        forged = grpc.ssl_channel_credentials(*(f.read_bytes() for f in (ours.cert, rogue.key, rogue.cert)))
        anonymous = grpc.ssl_channel_credentials(ours.cert.read_bytes())
        for port in (talker_port, codec_port):
            address = f"127.0.0.1:{port}"
            assert check(address, timeout=3.0, tls=tls), address
            assert not check(address, timeout=3.0), address  # the launcher's probe without the files
            if port == talker_port:
                assert _status(address, tls.channel_credentials()) == "ready"
                for credentials in (None, anonymous, forged):
                    assert _status(address, credentials) == "UNAVAILABLE", credentials
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(60)
    text = log.read_text()
    assert proc.returncode == 0, text[-3000:]
    assert "mutual TLS: clients need a certificate from --link-ca" in text, text[-3000:]
