"""Through the gateway, as a user would: parity with the in-process engines, client cancel, talker death.

Talker, codec and gateway run as separate processes (`voxstage talker|codec|gateway`) on localhost with the
tiny preset; the client is the Python SDK.
"""

from __future__ import annotations

import asyncio
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import numpy as np
import pytest

from tests.integration.reference import TEXT, in_process_reference
from tests.integration.stagekit import (
    ROOT,
    SEED_DEPLOY,
    StageProc,
    codec_status,
    eventually,
    stage_env,
    start_stage,
    talker_status,
)
from tests.integration.test_stages import RELAXED_STALL, free_port
from voxstage.client import SpeechClient, SpeechError
from voxstage.health_probe import check

pytestmark = pytest.mark.timeout(180)
FRAMES = 24


@dataclass
class Stack:
    talker: StageProc
    codec: StageProc
    gateway: subprocess.Popen[bytes]
    gateway_addr: str
    http_port: int
    codec_metrics_port: int
    talker_port: int
    cache: Path
    logs: Path


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    from voxstage.presets import resolve_model

    cache = tmp_path_factory.mktemp("gw-cache")
    logs = tmp_path_factory.mktemp("gw-logs")
    resolve_model("qwen3-tts-tiny", cache=cache)
    tp, cp, gp, hp, cm = (free_port() for _ in range(5))
    sets = [RELAXED_STALL]
    talker = start_stage("talker", port=tp, cache=cache, logs=logs, sets=sets)
    codec = start_stage("codec", port=cp, cache=cache, logs=logs, sets=sets, metrics_port=cm)
    cmd = [
        sys.executable, "-m", "voxstage", "gateway", "--config", str(SEED_DEPLOY),
        "--codec", codec.address, "--talker", talker.address,
        "--host", "127.0.0.1", "--grpc-port", str(gp), "--http-port", str(hp),
        *[a for s in sets for a in ("--set", s)],
    ]  # fmt: skip
    with (logs / "gateway.log").open("wb") as out:
        gateway = subprocess.Popen(cmd, env=stage_env(cache), stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
    st = Stack(talker, codec, gateway, f"127.0.0.1:{gp}", hp, cm, tp, cache, logs)
    try:
        talker.wait_serving()
        codec.wait_serving()
        deadline = time.monotonic() + 90
        while not check(st.gateway_addr, timeout=1.0):
            assert gateway.poll() is None and time.monotonic() < deadline, (logs / "gateway.log").read_text()
            time.sleep(0.5)
        yield st
    finally:
        gateway.send_signal(signal.SIGTERM)
        gateway.wait(timeout=60)
        for p in (st.codec, st.talker):
            p.stop()


def test_gateway_audio_equals_in_process_engines(stack: Stack) -> None:
    with SpeechClient(stack.gateway_addr) as client:
        audio = client.synthesize(TEXT, encoding="pcm_f32", voice="ryan", seed=42, max_frames=FRAMES)
    got = audio.to_numpy()
    ref = in_process_reference(stack.cache, FRAMES, seed=42)
    assert got.shape == ref.shape == (FRAMES * 1920,)
    np.testing.assert_allclose(got, ref, atol=1e-5, rtol=0)
    # Both inter-stage hops were timed (voxstage_stage_hop_seconds{from,to}).
    for port, hop in (
        (stack.codec_metrics_port, 'from="talker",to="codec"'),
        (stack.http_port, 'from="codec",to="gateway"'),
    ):
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read().decode()
        counts = re.findall(r"voxstage_stage_hop_seconds_count\{(.*?)\} (\S+)", body)
        assert any(labels == hop and float(n) > 0 for labels, n in counts), counts


def test_client_cancel_frees_the_talker_slot_and_codec_stream(stack: Stack) -> None:
    with SpeechClient(stack.gateway_addr) as client:
        session = client.session(encoding="pcm", voice="ryan", seed=1, max_frames=400)
        session.push_text(TEXT)
        session.end_input()
        next(iter(session))  # first audio arrived: the request is mid-stream
        session.close()  # the client goes away
    t0 = time.monotonic()

    async def idle() -> bool | None:
        t = await talker_status(stack.talker.address, requests=False)
        c = await codec_status(stack.codec.address, requests=False)
        return True if t.slots_in_use == 0 and c.active_streams == 0 else None

    assert asyncio.run(eventually(idle, within=5.0))
    print(f"slot and codec stream released {time.monotonic() - t0:.2f} s after the client left")


def test_talker_death_gives_unavailable_fast_then_recovers(stack: Stack) -> None:
    with SpeechClient(stack.gateway_addr) as client:
        chunks = client.stream(TEXT, voice="ryan", seed=2, max_frames=400)
        next(chunks)
        stack.talker.proc.send_signal(signal.SIGKILL)
        killed = time.monotonic()
        with pytest.raises(SpeechError) as err:
            for _ in chunks:
                pass
        elapsed = time.monotonic() - killed
    assert err.value.code is grpc.StatusCode.UNAVAILABLE, err.value
    assert elapsed < 2.0, f"the client waited {elapsed:.2f} s"

    stack.talker = start_stage(
        "talker", port=stack.talker_port, cache=stack.cache, logs=stack.logs, sets=[RELAXED_STALL], tag="-2"
    )
    stack.talker.wait_serving()
    deadline = time.monotonic() + 30  # the gateway re-probes a replica it marked down
    while True:
        try:
            with SpeechClient(stack.gateway_addr) as client:
                audio = client.synthesize(TEXT, voice="ryan", seed=3, max_frames=8)
            break
        except SpeechError as exc:
            assert exc.code is grpc.StatusCode.UNAVAILABLE and time.monotonic() < deadline, exc
            time.sleep(0.5)
    assert audio.duration_s == pytest.approx(8 * 0.08, abs=1e-6)
