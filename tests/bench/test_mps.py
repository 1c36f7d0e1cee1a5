"""``bench/mps.py``: the run's own MPS daemon is started with private directories that reach child processes,
and told to quit however the run ends. No GPU here: ``nvidia-cuda-mps-control`` is the stand-in of
tests/mpskit.py (the GPU run of ``bench/run_gpu.py --mps`` uses the real one)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.mps import mps_daemon
from tests.mpskit import install_fake_control


@pytest.fixture
def fake_control(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    bin_dir, calls = tmp_path / "bin", tmp_path / "calls.txt"
    install_fake_control(bin_dir, calls)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("CUDA_MPS_PIPE_DIRECTORY", raising=False)
    return calls


def test_the_daemon_runs_for_the_block_and_children_find_it(tmp_path: Path, fake_control: Path) -> None:
    root = tmp_path / "mps"
    with mps_daemon(root) as env:
        assert env["CUDA_MPS_PIPE_DIRECTORY"] == str(root / "pipe") and (root / "pipe" / "control").exists()
        child = subprocess.run(
            [sys.executable, "-c", "import os; print(os.environ['CUDA_MPS_PIPE_DIRECTORY'])"],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        assert child.stdout.strip() == str(root / "pipe")
    assert fake_control.read_text().splitlines() == ["-d", "", "stdin quit"]
    assert not (root / "pipe" / "control").exists() and "CUDA_MPS_PIPE_DIRECTORY" not in os.environ


def test_a_failing_run_still_stops_the_daemon(tmp_path: Path, fake_control: Path) -> None:
    with pytest.raises(RuntimeError, match="phase failed"), mps_daemon(tmp_path / "mps"):
        raise RuntimeError("phase failed")
    assert "stdin quit" in fake_control.read_text()


def test_without_the_control_program_the_run_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(RuntimeError, match="nvidia-cuda-mps-control is not on PATH"), mps_daemon(tmp_path):
        pass


def test_a_quit_that_hangs_is_reported_not_raised(
    tmp_path: Path, fake_control: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # The real quit waits for every client; the run's results are written by then, so it must not fail.
    hanging = tmp_path / "bin" / "nvidia-cuda-mps-control"
    hanging.write_text(hanging.read_text().replace("read command;", "read command; sleep 5;"))
    with caplog.at_level(logging.WARNING), mps_daemon(tmp_path / "mps", quit_timeout_s=0.5):
        pass
    assert "did not quit within 0.5 s" in caplog.text
