"""A fourth family is a folder and a registry line: the toy family of the test tree (tests/toy_family) is
registered through ``VOXSTAGE_FAMILIES`` only, and ``voxstage serve`` runs it as three processes that a
client reaches as for any family. Its preset is built by its own writers, its stages load it through its
descriptor's loaders, the gateway learns its voice from the talker's Status, and the audio is the toy
codec's tone for each byte of the text, in order and continuous.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tests.integration.deploykit import free_port
from tests.integration.stagekit import ROOT, stage_env
from tests.toy_family.codec import RATE, tone
from tests.toy_family.descriptor import FAMILY
from voxstage.health_probe import check

pytestmark = pytest.mark.timeout(240)
TEXT = "Toy!"


def test_a_family_from_the_test_tree_serves_a_request_end_to_end(tmp_path: Path) -> None:
    from voxstage.client import SpeechClient

    env = stage_env(tmp_path / "cache")
    env["VOXSTAGE_FAMILIES"] = "tests.toy_family.descriptor"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    grpc_port, http_port = free_port(), free_port()
    model = FAMILY.presets[0].name
    cmd = [sys.executable, "-m", "voxstage", "serve", str(ROOT / FAMILY.deploy_file), "--model", model]
    cmd += ["--device", "cpu", "--threads", "1", "--drain-grace", "5", "--host", "127.0.0.1"]
    cmd += ["--grpc-port", str(grpc_port), "--http-port", str(http_port)]
    log = tmp_path / "serve.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
    try:
        deadline = time.monotonic() + 120
        while not check(f"127.0.0.1:{grpc_port}", timeout=1.0):
            assert proc.poll() is None, log.read_text()[-4000:]
            assert time.monotonic() < deadline, log.read_text()[-4000:]
            time.sleep(0.3)
        with SpeechClient(f"127.0.0.1:{grpc_port}") as client:
            voices = client.list_voices()
            audio = client.synthesize(TEXT, voice="alloy")  # the toy descriptor's alias of its one voice
        assert [v.name for v in voices] == ["toy"]
        assert audio.sample_rate == RATE
        expected, _ = tone(np.frombuffer(TEXT.encode(), np.uint8))
        np.testing.assert_allclose(audio.to_numpy(), expected, atol=1e-4)  # 16-bit PCM on the wire
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
