"""``voxstage serve`` supervises its stages: a crashed stage is restarted alone, the others keep running.

``kill -9`` the codec of a running stack: the launcher reaps it, sweeps its ``/dev/shm`` files and starts a
new codec on the same port; the talker and the gateway keep their processes, and the gateway routes to the
new codec as soon as it is SERVING, so the SDK is served again within a bound. With no restart budget left
the launcher stops everything and exits 1 naming the stage, as before supervision.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.integration.stagekit import SPF
from tests.integration.test_serve import FRAMES, cache, free_port, serve  # noqa: F401 - cache is a fixture
from voxstage.health_probe import check

pytestmark = pytest.mark.timeout(120)

RECOVERY_BOUND_S = 30.0  # a tiny CPU codec reloads and warms up in a few seconds; slack for a loaded host


def stage_pids(launcher: int) -> dict[str, int]:
    """The launcher's children by stage name (``python -m voxstage <stage> ...``)."""
    out = subprocess.run(
        ["ps", "-o", "pid=,args=", "--ppid", str(launcher)], capture_output=True, text=True
    ).stdout
    pids: dict[str, int] = {}
    for line in out.splitlines():
        m = re.match(r"\s*(\d+)\s+.*-m voxstage (talker|codec|gateway)\b", line)
        if m:
            pids[m[2]] = int(m[1])
    return pids


def running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state != "Z"


def shm_files_of(pid: int) -> list[str]:
    return [n for n in os.listdir("/dev/shm") if n.startswith(f"voxstage-{pid}-")]


def wait_until(proc: subprocess.Popen[bytes], log: Path, ok: object, limit_s: float) -> float:
    start = time.monotonic()
    while not ok():  # type: ignore[operator]
        assert proc.poll() is None, log.read_text()[-4000:]
        assert time.monotonic() - start < limit_s, log.read_text()[-4000:]
        time.sleep(0.1)
    return time.monotonic() - start


def test_a_killed_codec_is_restarted_alone_and_the_stack_serves_again(cache: Path, tmp_path: Path) -> None:  # noqa: F811
    from voxstage.client import SpeechClient, SpeechError

    grpc_port, http_port, codec_port = free_port(), free_port(), free_port()
    log = tmp_path / "serve.log"
    proc = serve(
        cache, log,
        "--grpc-port", str(grpc_port), "--http-port", str(http_port), "--host", "127.0.0.1",
        "--codec-port", str(codec_port), "--restart-backoff", "0.5",
        "--set", f"stages.0.default_sampling_params.max_tokens={FRAMES}",
    )  # fmt: skip
    try:
        wait_until(proc, log, lambda: check(f"127.0.0.1:{grpc_port}", timeout=1.0), 90)
        before = stage_pids(proc.pid)
        assert set(before) == {"talker", "codec", "gateway"}, (before, log.read_text())
        with SpeechClient(f"127.0.0.1:{grpc_port}", timeout=60) as client:
            assert client.synthesize("before the crash", voice="ryan").to_numpy().size == FRAMES * SPF
        dead = before["codec"]
        os.kill(dead, signal.SIGKILL)
        killed_at = time.monotonic()

        served_in: float | None = None
        with SpeechClient(f"127.0.0.1:{grpc_port}", timeout=20) as client:
            while served_in is None:
                assert time.monotonic() - killed_at < RECOVERY_BOUND_S, log.read_text()[-4000:]
                assert proc.poll() is None, log.read_text()[-4000:]  # the launcher keeps running
                try:
                    audio = client.synthesize("after the crash", voice="ryan", seed=1)
                except SpeechError:
                    time.sleep(0.2)
                    continue
                served_in = time.monotonic() - killed_at
                assert audio.to_numpy().size == FRAMES * SPF
        after = stage_pids(proc.pid)
        assert after["talker"] == before["talker"] and after["gateway"] == before["gateway"], (before, after)
        assert after["codec"] != dead and check(f"127.0.0.1:{codec_port}", timeout=1.0)
        assert not shm_files_of(dead), shm_files_of(dead)  # swept when the launcher reaped it
        text = log.read_text()
        assert f"codec stage (pid {dead}) exited unexpectedly with code -9" in text, text[-4000:]
        assert "restarting codec stage in 0.5 s (restart 1 of 5 allowed per 300 s)" in text, text[-4000:]
        assert "codec stage is SERVING again" in text, text[-4000:]
        print(f"served again {served_in:.1f} s after kill -9 of the codec")

        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0, log.read_text()[-4000:]
        assert not [p for p in after.values() if Path(f"/proc/{p}").exists()], "a stage outlived the launcher"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_stage_past_its_restart_budget_stops_everything(cache: Path, tmp_path: Path) -> None:  # noqa: F811
    log = tmp_path / "serve-budget.log"
    talker_port = free_port()
    proc = serve(cache, log, "--no-gateway", "--talker-port", str(talker_port), "--restart-budget", "0")
    try:
        wait_until(proc, log, lambda: len(stage_pids(proc.pid)) == 2 and "all stages SERVING" in
                   log.read_text(), 90)  # fmt: skip
        pids = stage_pids(proc.pid)
        os.kill(pids["talker"], signal.SIGKILL)
        assert proc.wait(60) == 1, log.read_text()[-4000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = log.read_text()
    assert "talker stage died again after 0 restart(s) within 300 s (--restart-budget 0)" in text, text
    assert "codec stage exited with code 0" in text, text  # the survivor was drained, not killed
    assert not Path(f"/proc/{pids['codec']}").exists()


def test_the_stages_stop_when_the_launcher_is_killed(cache: Path, tmp_path: Path) -> None:  # noqa: F811
    """SIGKILL leaves the launcher no chance to forward anything: the kernel's parent-death signal, which
    each stage arms itself (``voxstage.lifetime``), must stop them."""
    log = tmp_path / "serve-killed.log"
    proc = serve(cache, log, "--no-gateway")
    try:
        wait_until(proc, log, lambda: "all stages SERVING" in log.read_text(), 90)
        pids = stage_pids(proc.pid)
        assert set(pids) == {"talker", "codec"}, (pids, log.read_text())
    finally:
        proc.kill()
        proc.wait()

    def alive() -> list[int]:  # a zombie (exited, not yet reaped by its new parent) counts as stopped
        return [p for p in pids.values() if running(p)]

    deadline = time.monotonic() + 30
    while alive() and time.monotonic() < deadline:
        time.sleep(0.2)
    left = alive()
    for pid in left:  # do not leave them to the rest of the suite
        os.kill(pid, signal.SIGKILL)
    assert not left, f"stages {left} outlived a SIGKILLed launcher"
