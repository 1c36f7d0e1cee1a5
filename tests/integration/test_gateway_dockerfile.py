"""The Dockerfile's default command (``voxstage serve`` of all three stages) as a real process: the gateway
it starts becomes healthy, serves a request, and the whole tree drains and exits 0 on SIGTERM."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from tests.integration.deploykit import PORT_FLAGS, dockerfile_cmd, free_port, start
from voxstage.client import SpeechClient


def test_dockerfile_cmd_serves_and_drains(tmp_path: Path) -> None:
    command = dockerfile_cmd()
    assert command[:4] == ["python", "-m", "voxstage", "serve"]
    command[0] = sys.executable  # `python` in the image is this venv's interpreter here
    ports: dict[str, int] = {}
    for i, arg in enumerate(command[:-1]):
        if arg in PORT_FLAGS:
            ports[arg] = free_port()
            command[i + 1] = str(ports[arg])
    grpc_addr = f"127.0.0.1:{ports['--grpc-port']}"
    health = [sys.executable, "-m", "voxstage.health_probe", "--addr", grpc_addr]
    env = {**os.environ, "VOXSTAGE_CACHE": str(tmp_path / "cache"), "PYTHONUNBUFFERED": "1"}
    proc = start("serve", command, health, env, tmp_path)
    try:
        proc.wait_healthy(600)
        with SpeechClient(grpc_addr) as client:
            audio = client.synthesize("From the image's default command.", encoding="pcm", max_frames=4)
        assert audio.sample_rate == 24_000 and 0 < len(audio.to_numpy()) <= 4 * 1920
    finally:
        code = proc.stop(120)
    assert code == 0, proc.tail()
