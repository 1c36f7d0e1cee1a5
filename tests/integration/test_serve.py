"""``voxstage serve``: talker, codec and gateway as separate processes (the stages together, the gateway once
they serve), stopped cleanly.

Through the public API (the Python SDK against the gateway's gRPC port): a request returns the expected
audio; SIGTERM to the launcher drains every stage and everything exits 0. A stage that cannot start makes
the launch fail, naming that stage.

MPS (the last tests): the launcher runs a CUDA MPS control daemon of its own when a stage's
``mps_active_thread_percentage`` shares a GPU: private pipe and log directories that every stage process
sees, ``quit`` when the launch ends, however it ends. The daemon is the stand-in of tests/mpskit.py (no GPU
here): with ``--device auto`` on a CPU-only machine the stages run on the CPU and only warn that their share
does nothing, but the launcher does what it does on a GPU host.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.integration.deploykit import free_port
from tests.integration.stagekit import MODEL, ROOT, SEED_DEPLOY, SPF, stage_env
from tests.mpskit import install_fake_control
from voxstage.health_probe import check

pytestmark = pytest.mark.timeout(120)

FRAMES = 24




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
    # The codec started beside it (the two load together) and was stopped; nothing after them started.
    assert "starting codec" in text and "codec stage exited with code" in text, text
    assert "starting gateway" not in text, text


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


def serve_with_fake_daemon(cache: Path, tmp_path: Path, *extra: str) -> tuple[subprocess.Popen[bytes], Path]:
    install_fake_control(tmp_path / "bin", tmp_path / "calls.txt")
    env = stage_env(cache)
    env["PATH"] = f"{tmp_path / 'bin'}{os.pathsep}{env['PATH']}"
    env[  # where no daemon runs: the launcher must start its own, not find the host's
        "CUDA_MPS_PIPE_DIRECTORY"
    ] = str(tmp_path / "no-daemon")
    env["TMPDIR"] = str(tmp_path)  # the private runtime directory lands here, where the test can look
    cmd = [sys.executable, "-m", "voxstage", "serve", str(SEED_DEPLOY), "--model", MODEL, "--device", "auto"]
    cmd += ["--threads", "1", "--drain-grace", "10", "--start-timeout", "90", "--no-gateway"]
    cmd += ["--set", "stages.0.mps_active_thread_percentage=40", *extra]
    log = tmp_path / "serve.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
    return proc, log


def private_dirs(tmp_path: Path) -> list[Path]:
    return sorted(tmp_path.glob("vx-mps-*"))


def test_serve_runs_a_private_daemon_its_stages_use_and_stops_it(cache: Path, tmp_path: Path) -> None:
    proc, log = serve_with_fake_daemon(cache, tmp_path)
    try:
        deadline = time.monotonic() + 120
        while "all stages SERVING" not in log.read_text():
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.2)
        (root,) = private_dirs(tmp_path)
        assert (root / "pipe" / "control").exists() and (root / "log").is_dir()
        pids = children(proc.pid)
        assert len(pids) == 2, pids  # talker and codec
        for pid in pids:
            env = dict(
                item.split("=", 1)
                for item in Path(f"/proc/{pid}/environ").read_text().split("\0")
                if "=" in item
            )
            assert env["CUDA_MPS_PIPE_DIRECTORY"] == str(root / "pipe"), pid
            assert env["CUDA_MPS_LOG_DIRECTORY"] == str(root / "log"), pid
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert (tmp_path / "calls.txt").read_text().splitlines() == ["-d", "", "stdin quit"]
    assert not private_dirs(tmp_path), "the private runtime directory outlived the launch"
    assert "MPS: starting a private control daemon for the shares on GPU 0" in log.read_text()


def test_a_launch_cut_short_still_stops_the_daemon(cache: Path, tmp_path: Path) -> None:
    # SIGTERM while the talker is still loading: the launch ends without serving, and the daemon with it.
    proc, log = serve_with_fake_daemon(cache, tmp_path)
    try:
        deadline = time.monotonic() + 60
        while "starting talker" not in log.read_text():
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "stdin quit" in (tmp_path / "calls.txt").read_text() and not private_dirs(tmp_path)


def test_a_share_that_cannot_work_is_refused_before_anything_starts(cache: Path, tmp_path: Path) -> None:
    # The codec on GPU 1, the talker's share alone on GPU 0: nothing to share the GPU with.
    proc, log = serve_with_fake_daemon(cache, tmp_path, "--set", "stages.1.devices=1")
    assert proc.wait(60) == 2
    text = log.read_text()
    assert "talker: mps_active_thread_percentage is 40, but no other stage process runs on its GPU 0" in text
    assert not (tmp_path / "calls.txt").exists() and "starting talker" not in text
