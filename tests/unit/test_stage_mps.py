"""``mps_active_thread_percentage``: a stage applies its MPS share before CUDA starts, or refuses to start
when no MPS daemon would honour it. No daemon runs here, so its control pipe is a file the test makes (the
GPU run of ``bench/run_gpu.py --mps`` starts a real one)."""

from __future__ import annotations

import argparse
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.mpskit import install_fake_control
from voxstage.stage.mps import (
    PIPE_DIR_ENV,
    THREAD_PERCENTAGE_ENV,
    MpsUnavailableError,
    StageShare,
    apply_thread_percentage,
    pipe_dir,
    serve_plan,
)
from voxstage.stage.process import load_stage_setup

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy" / "qwen3_tts.yaml"


def test_no_share_leaves_the_environment_alone() -> None:
    env: dict[str, str] = {}
    assert apply_thread_percentage(None, env) is None and env == {}


def test_without_a_daemon_the_share_is_refused_naming_key_and_pipe(tmp_path: Path) -> None:
    env = {PIPE_DIR_ENV: str(tmp_path)}
    with pytest.raises(MpsUnavailableError, match="mps_active_thread_percentage is 40") as info:
        apply_thread_percentage(40, env)
    assert str(tmp_path / "control") in str(info.value) and THREAD_PERCENTAGE_ENV not in env


def test_with_a_daemon_the_share_is_set_for_the_driver(tmp_path: Path) -> None:
    (tmp_path / "control").touch()
    env = {PIPE_DIR_ENV: str(tmp_path)}
    line = apply_thread_percentage(60, env)
    assert env[THREAD_PERCENTAGE_ENV] == "60" and line is not None and str(tmp_path) in line


def test_the_default_pipe_directory_is_the_drivers() -> None:
    assert pipe_dir({}) == Path("/tmp/nvidia-mps")


def stage_args(*extra: str) -> argparse.Namespace:
    from voxstage.stage.process import add_stage_options

    parser = argparse.ArgumentParser()
    add_stage_options(parser, default_port=0)
    return parser.parse_args(["--config", str(DEPLOY), "--model", "qwen3-tts-tiny", *extra])


def test_a_stage_on_cpu_warns_that_the_share_does_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("VOXSTAGE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv(PIPE_DIR_ENV, str(tmp_path))  # no daemon: a GPU stage would refuse
    monkeypatch.delenv(THREAD_PERCENTAGE_ENV, raising=False)
    args = stage_args("--device", "cpu", "--set", "stages.1.mps_active_thread_percentage=30")
    with caplog.at_level(logging.WARNING):
        setup = load_stage_setup(args, logging.getLogger("test"), cuda_default="float32", role="codec")
    assert setup.device == "cpu" and setup.config.codec.mps_active_thread_percentage == 30
    assert "no effect with --device cpu" in caplog.text
    assert THREAD_PERCENTAGE_ENV not in os.environ


def test_a_gpu_stage_without_a_daemon_exits_naming_the_key(tmp_path: Path) -> None:
    env = {**os.environ, PIPE_DIR_ENV: str(tmp_path), "VOXSTAGE_CACHE": str(tmp_path / "cache")}
    cmd = [sys.executable, "-m", "voxstage", "talker", "--config", str(DEPLOY), "--model", "qwen3-tts-tiny"]
    cmd += ["--device", "auto", "--port", "0", "--set", "stages.0.mps_active_thread_percentage=50"]
    done = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr
    assert "talker: cannot start: mps_active_thread_percentage is 50" in done.stderr
    assert str(tmp_path / "control") in done.stderr


# -- voxstage serve's own daemon (serve_plan): when it starts one, and why it refuses -----------------------


def shares(talker: int | None, codec: int | None, codec_gpu: str = "0") -> list[StageShare]:
    return [StageShare("talker", "0", talker), StageShare("codec", codec_gpu, codec)]


def test_serve_starts_a_daemon_for_shares_on_a_shared_gpu(tmp_path: Path) -> None:
    install_fake_control(tmp_path / "bin", tmp_path / "calls")
    env = {"PATH": str(tmp_path / "bin"), PIPE_DIR_ENV: str(tmp_path / "none")}
    line = serve_plan(shares(40, 60), "auto", env)
    assert line is not None and "GPU 0" in line
    assert serve_plan(shares(None, 60), "cuda", env) is not None  # one share is enough: both become clients


def test_serve_starts_none_without_shares_on_cpu_or_beside_a_running_daemon(tmp_path: Path) -> None:
    env = {"PATH": str(tmp_path), PIPE_DIR_ENV: str(tmp_path)}  # no control program on this PATH
    assert serve_plan(shares(None, None), "cuda", env) is None
    assert serve_plan(shares(40, 60), "cpu", env) is None  # the stages warn that the share does nothing
    (tmp_path / "control").touch()  # a daemon of the host's answers: the stages use it
    assert serve_plan(shares(40, 60), "cuda", env) is None


def test_serve_refuses_a_share_on_a_gpu_of_its_own(tmp_path: Path) -> None:
    install_fake_control(tmp_path / "bin", tmp_path / "calls")
    env = {"PATH": str(tmp_path / "bin")}
    with pytest.raises(MpsUnavailableError, match="codec: mps_active_thread_percentage is 60, but no other"):
        serve_plan(shares(None, 60, codec_gpu="1"), "cuda", env)


def test_serve_refuses_when_it_cannot_start_a_daemon(tmp_path: Path) -> None:
    env = {"PATH": str(tmp_path), PIPE_DIR_ENV: str(tmp_path)}
    with pytest.raises(MpsUnavailableError, match="nvidia-cuda-mps-control is not on PATH") as info:
        serve_plan(shares(40, 60), "auto", env)
    assert "talker 40 %, codec 60 %" in str(info.value) and str(tmp_path / "control") in str(info.value)


def test_a_lone_replicas_share_is_only_warned_about(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    install_fake_control(tmp_path / "bin", tmp_path / "calls")
    env = {"PATH": str(tmp_path / "bin"), PIPE_DIR_ENV: str(tmp_path / "none")}
    placed = [StageShare("talker-0", "0", 40), StageShare("talker-1", "1", 40), StageShare("codec", "0", 60)]
    with caplog.at_level(logging.WARNING):
        assert serve_plan(placed, "cuda", env) is not None
    assert "talker-1: mps_active_thread_percentage 40 caps nothing on GPU 1" in caplog.text
