"""``voxstage serve``: talker, codec and gateway as separate processes, started in order and stopped cleanly.

Through the public API (the Python SDK against the gateway's gRPC port): a request returns the expected
audio; SIGTERM to the launcher drains every stage and everything exits 0. A stage that cannot start makes
the launch fail, naming that stage.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.integration.stagekit import MODEL, ROOT, SEED_DEPLOY, SPF, stage_env
from voxstage.health_probe import check

pytestmark = pytest.mark.timeout(120)

FRAMES = 24


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from voxstage.presets import resolve_model

    path = tmp_path_factory.mktemp("vxcache-serve")
    resolve_model(MODEL, cache=path)
    return path


def serve(cache: Path, log: Path, *extra: str) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "voxstage", "serve", str(SEED_DEPLOY), "--model", MODEL, "--device", "cpu"]
    cmd += ["--threads", "1", "--drain-grace", "10", "--start-timeout", "60", *extra]
    with log.open("wb") as out:
        return subprocess.Popen(cmd, env=stage_env(cache), stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)


def children(pid: int) -> list[int]:
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def test_serve_answers_through_the_gateway_and_stops_cleanly(cache: Path, tmp_path: Path) -> None:
    from voxstage.client import SpeechClient

    grpc_port, http_port = free_port(), free_port()
    log = tmp_path / "serve.log"
    proc = serve(
        cache,
        log,
        "--grpc-port", str(grpc_port), "--http-port", str(http_port), "--host", "127.0.0.1",
        "--set", f"stages.0.default_sampling_params.max_tokens={FRAMES}",
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 90
        while not check(f"127.0.0.1:{grpc_port}", timeout=1.0):
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        stages = children(proc.pid)
        assert len(stages) == 3, (stages, log.read_text())  # talker, codec, gateway: separate processes
        with SpeechClient(f"127.0.0.1:{grpc_port}", timeout=60) as client:
            audio = client.synthesize(
                "hello world, this is a test", encoding="pcm_f32", voice="ryan", seed=42
            )
        samples = audio.to_numpy()
        assert audio.sample_rate == 24000 and samples.size == FRAMES * SPF, log.read_text()[-3000:]
        assert samples.std() > 0.01
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0, log.read_text()[-3000:]
        text = log.read_text()
        for name in ("gateway", "codec", "talker"):
            assert f"{name} stage exited with code 0" in text, text[-3000:]
        assert not [p for p in stages if Path(f"/proc/{p}").exists()], "a stage outlived the launcher"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_serve_fails_loudly_naming_a_stage_that_cannot_start(cache: Path, tmp_path: Path) -> None:
    log = tmp_path / "serve-bad.log"
    # 100000 positions exceed the tiny talker's 4096: the talker refuses to start.
    proc = serve(cache, log, "--no-gateway", "--set", "stages.0.max_model_len=100000")
    try:
        code = proc.wait(90)
    finally:
        if proc.poll() is None:
            proc.kill()
    text = log.read_text()
    assert code == 1, text
    assert "talker stage exited with code 1 during start-up" in text, text
    assert "max_model_len is 100000" in text, text
    assert "starting codec" not in text, text  # nothing after the failed stage is started


def test_serve_sees_a_tls_gateway_become_ready(cache: Path, tmp_path: Path) -> None:
    # With gateway.tls_cert_file the public gRPC port speaks only TLS: the launcher's plain health probe
    # never saw it SERVING and gave up after --start-timeout. It now probes the HTTPS /health.
    from tests.tlskit import self_signed
    from voxstage.client import SpeechClient

    cert, key = self_signed(tmp_path)
    grpc_port, http_port = free_port(), free_port()
    log = tmp_path / "serve-tls.log"
    proc = serve(
        cache,
        log,
        "--grpc-port", str(grpc_port), "--http-port", str(http_port), "--host", "127.0.0.1",
        "--set", f"gateway.tls_cert_file={cert}", "--set", f"gateway.tls_key_file={key}",
        "--set", "stages.0.default_sampling_params.max_tokens=4",
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 90
        while "gateway stage is SERVING" not in log.read_text():
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.2)
        with SpeechClient(f"localhost:{grpc_port}", tls=True, root_certificates=cert.read_bytes()) as client:
            assert client.synthesize("hi", voice="ryan").duration_s > 0
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
