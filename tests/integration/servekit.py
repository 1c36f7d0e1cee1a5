"""``voxstage serve`` stacks shared by several test modules (a stack start costs seconds of CI each time).

``serve_stack`` starts one stack of a deploy file and a preset as real processes and yields it once every
stage is SERVING; ``tests/integration/conftest.py`` keeps the Audio8 and PersonaPlex stacks for the whole
session, so their end-to-end modules and the reliability probes of ``test_chaos.py`` use the same ones.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.integration.deploykit import free_port
from tests.integration.stagekit import ROOT, stage_env
from tests.integration.test_serve_supervision import stage_pids
from voxstage.health_probe import check

AUDIO8_FRAMES = 6  # every Audio8 request is capped here (max_tokens): a random model rarely stops by itself
BASE_FRAMES = 12  # the Qwen3-TTS base stack's max_tokens: its requests stay short
DUPLEX_SEND_TIMEOUT_S = 4.0  # short, so that test_chaos sees a client that stops reading cut soon


@dataclass
class Served:
    proc: subprocess.Popen[bytes]
    log: Path
    grpc_port: int
    http_port: int
    cache: Path
    # The stages' own addresses (a second gateway in front of them: test_voice_library) and the voice
    # library directory the gateway was given (gateway.voice_store_dir).
    talker_port: int = 0
    codec_port: int = 0
    voice_store: Path | None = None
    deploy: Path | None = None
    model: str = ""

    @property
    def grpc_addr(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def http_addr(self) -> str:
        return f"127.0.0.1:{self.http_port}"

    @property
    def http_url(self) -> str:
        return f"http://{self.http_addr}"

    def stage_pids(self) -> dict[str, int]:
        return stage_pids(self.proc.pid)

    def tail(self, chars: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-chars:]


def serve_stack(
    factory: pytest.TempPathFactory,
    name: str,
    deploy: Path,
    model: str,
    sets: Sequence[str] = (),
    *,
    start_timeout_s: float = 180.0,
    cache: Path | None = None,
    store: Path | None = None,
    args: Sequence[str] = (),
) -> Iterator[Served]:
    """``cache`` (a preset cache already built) and ``store`` (a voice library) may be another stack's:
    a second stack over the same store is what a restart or a second replica sees. ``args``: more
    ``voxstage serve`` flags."""
    from voxstage.presets import resolve_model

    if cache is None:
        cache = factory.mktemp(f"vxcache-{name}")
        resolve_model(model, cache=cache)
    log = factory.mktemp(f"{name}-logs") / "serve.log"
    grpc_port, http_port, talker_port, codec_port = free_port(), free_port(), free_port(), free_port()
    store = store or factory.mktemp(f"{name}-voices")
    cmd = [sys.executable, "-m", "voxstage", "serve", str(deploy), "--model", model, "--device", "cpu"]
    cmd += ["--threads", "1", "--drain-grace", "10", "--start-timeout", "120", "--host", "127.0.0.1"]
    cmd += ["--grpc-port", str(grpc_port), "--http-port", str(http_port)]
    cmd += ["--talker-port", str(talker_port), "--codec-port", str(codec_port)]
    cmd += ["--set", f"gateway.voice_store_dir={store}"]
    cmd += [a for s in sets for a in ("--set", s)] + list(args)
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, env=stage_env(cache), stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
    served = Served(proc, log, grpc_port, http_port, cache, talker_port, codec_port, store, deploy, model)
    try:
        deadline = time.monotonic() + start_timeout_s
        while not check(served.grpc_addr, timeout=1.0):
            assert proc.poll() is None, served.tail()
            assert time.monotonic() < deadline, served.tail()
            time.sleep(0.3)
        yield served
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0, served.tail(3000)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
