"""A Node.js ``@grpc/grpc-js`` client built from ``protos/`` alone (tests/node/client.js) against the real
stack, started by ``voxstage serve`` on the tiny preset: unary ``Synthesize`` reports a measured time to
first audio, two flushed segments of one ``StreamingSynthesize`` each bring audio and a ``segment_done``,
and ``grpc.reflection.v1`` lists the services. The serve log carries the access line of a failed request.

The client's npm packages (pinned in tests/node/package-lock.json) are installed with ``npm ci`` into a cache
directory keyed by the lock file, once per lock.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from tests.integration.deploykit import free_port
from tests.integration.stagekit import MODEL, ROOT, SEED_DEPLOY, stage_env
from voxstage.health_probe import check
from voxstage.v1 import speech_pb2, speech_pb2_grpc

pytestmark = pytest.mark.timeout(300)
NODE_DIR = ROOT / "tests" / "node"


def node_modules() -> Path:
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        pytest.skip("node and npm are needed for the grpc-js client (tests/node); not installed")
    lock = (NODE_DIR / "package-lock.json").read_bytes()
    base = Path(os.environ.get("VOXSTAGE_CACHE") or Path.home() / ".cache" / "voxstage")
    target = base / "node-client" / hashlib.sha256(lock).hexdigest()[:16]
    if not (target / "node_modules" / "@grpc" / "grpc-js").is_dir():
        target.mkdir(parents=True, exist_ok=True)
        for name in ("package.json", "package-lock.json"):
            shutil.copy(NODE_DIR / name, target / name)
        done = subprocess.run(
            [npm, "ci", "--no-audit", "--no-fund", "--ignore-scripts"],
            cwd=target, capture_output=True, text=True, timeout=240,
        )  # fmt: skip
        assert done.returncode == 0, f"npm ci failed:\n{done.stdout}\n{done.stderr}"
    return target / "node_modules"


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    from voxstage.presets import resolve_model

    cache = tmp_path_factory.mktemp("vxcache-node")
    resolve_model(MODEL, cache=cache)
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    port, http_port = free_port(), free_port()
    cmd = [
        sys.executable, "-m", "voxstage", "serve", str(SEED_DEPLOY), "--model", MODEL, "--device", "cpu",
        "--threads", "1", "--drain-grace", "10", "--start-timeout", "90", "--host", "127.0.0.1",
        "--grpc-port", str(port), "--http-port", str(http_port),
        "--set", "stages.0.default_sampling_params.max_tokens=4",
    ]  # fmt: skip
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, env=stage_env(cache), stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
    try:
        deadline = time.monotonic() + 120
        while not check(f"127.0.0.1:{port}", timeout=1.0):
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.3)
        yield f"127.0.0.1:{port}", log
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def node_results(served: tuple[str, Path]) -> dict[str, dict[str, object]]:
    modules = node_modules()
    address, _ = served
    done = subprocess.run(
        ["node", str(NODE_DIR / "client.js"), address, str(ROOT / "protos")],
        env={**os.environ, "NODE_PATH": str(modules)}, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    results = {}
    for line in done.stdout.splitlines():
        item = json.loads(line)
        results[item["check"]] = item
    assert set(results) == {"unary_ttfa", "two_segments", "reflection_v1"}, done.stdout + done.stderr
    return results


def test_unary_time_to_first_audio_is_measured(node_results: dict[str, dict[str, object]]) -> None:
    assert node_results["unary_ttfa"]["ok"], node_results["unary_ttfa"]


def test_reflection_v1_lists_the_services(node_results: dict[str, dict[str, object]]) -> None:
    assert node_results["reflection_v1"]["ok"], node_results["reflection_v1"]


def test_two_flushed_segments_each_bring_audio(node_results: dict[str, dict[str, object]]) -> None:
    # Needs each flush to make its own segment (issue 16's segments work).
    assert node_results["two_segments"]["ok"], node_results["two_segments"]


def test_a_failed_request_leaves_an_access_line_in_the_serve_log(served: tuple[str, Path]) -> None:
    address, log = served
    with grpc.insecure_channel(address) as channel:
        stub = speech_pb2_grpc.SpeechStub(channel)
        config = speech_pb2.SynthesisConfig(encoding=speech_pb2.AUDIO_ENCODING_PCM_S16LE, voice="nobody")
        with pytest.raises(grpc.RpcError) as err:
            stub.Synthesize(speech_pb2.SynthesizeRequest(config=config, text="Refused."), timeout=30)
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    pattern = re.compile(
        r"voxstage\.gateway\.access: request id=\S+ api=grpc_synthesize .*outcome=invalid .*code=NOT_FOUND"
    )
    deadline = time.monotonic() + 10
    while not pattern.search(log.read_text(errors="replace")):
        assert time.monotonic() < deadline, log.read_text(errors="replace")[-3000:]
        time.sleep(0.2)
