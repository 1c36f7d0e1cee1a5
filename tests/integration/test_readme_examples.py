"""The README's API examples, exactly as written, against ``voxstage serve`` on the built-in tiny model.

A new user runs them on CPU against the default ports; each must finish in under 30 s with audio. They used
to run for minutes: the random tiny model rarely says end-of-speech, and nothing bounded a take but the
deploy file's ``max_tokens``. The text-derived frame cap (voxstage.segments) now ends such a take within a
few seconds of audio.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import time
import wave
from collections.abc import Iterator
from pathlib import Path

import pytest
import soundfile as sf

from tests.integration.stagekit import MODEL, ROOT, SEED_DEPLOY, stage_env
from voxstage.health_probe import check

README = (ROOT / "README.md").read_text()
LIMIT_S = 30.0
PORTS = (50051, 8000)  # what the examples name


def blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", README, flags=re.S)


def example(lang: str, marker: str) -> str:
    found = [b for b in blocks(lang) if marker in b]
    assert len(found) == 1, f"README: expected one ```{lang} block with {marker!r}, found {len(found)}"
    return found[0]


def busy(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    if any(busy(p) for p in PORTS):
        pytest.skip(f"a README port ({PORTS}) is taken on this machine; the examples hard-code them")
    cache = tmp_path_factory.mktemp("vxcache-readme")
    log = tmp_path_factory.mktemp("readme") / "serve.log"
    cmd = [sys.executable, "-m", "voxstage", "serve", str(SEED_DEPLOY), "--model", MODEL, "--device", "cpu"]
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, env=stage_env(cache), stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
    try:
        deadline = time.monotonic() + 120
        while not check("localhost:50051", timeout=1.0):
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.5)
        work = tmp_path_factory.mktemp("readme-cwd")
        (work / ".venv").symlink_to(ROOT / ".venv")  # the examples call .venv/bin/voxstage
        yield work
    finally:
        proc.terminate()
        proc.wait(60)


def run(cmd: list[str], cwd: Path) -> float:
    t0 = time.monotonic()
    done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=LIMIT_S + 30)
    elapsed = time.monotonic() - t0
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return elapsed


SERVED = f"server: voxstage serve deploy/qwen3_tts.yaml --model {MODEL}"  # what `served` runs


def test_every_example_names_the_server_it_needs() -> None:
    """Issue 29: followed in order, the README left a PersonaPlex server running when the TTS examples came
    next. Every block that talks to a server says which one; the ones run here name the one they get."""
    for lang in ("bash", "python"):
        for block in blocks(lang):
            if re.search(r"localhost:(50051|8000)", block):
                assert "server: voxstage serve deploy/" in block, block
    for lang, marker in (("python", "SpeechClient("), ("bash", "curl -s"), ("python", "speech.create(")):
        assert SERVED in example(lang, marker)


def test_sdk_example(served: Path) -> None:
    code = example("python", 'SpeechClient("localhost:50051")')
    assert run([sys.executable, "-c", code], served) < LIMIT_S
    assert (served / "hello.wav").stat().st_size > 44


def test_curl_example(served: Path) -> None:
    code = example("bash", "curl -s localhost:8000/v1/audio/speech")
    assert run(["bash", "-c", code], served) < LIMIT_S
    # Issue 29: the file is a whole WAV whose sizes are exact, so every reader agrees on its length.
    path = served / "hello.wav"
    data = path.read_bytes()
    assert data[:4] == b"RIFF" and int.from_bytes(data[4:8], "little") == len(data) - 8
    with wave.open(str(path)) as w:
        frames = w.getnframes()
        assert (w.getframerate(), w.getsampwidth(), w.getnchannels()) == (24_000, 2, 1)
        assert frames == (len(data) - 44) // 2 > 0 and w.readframes(frames) == data[44:]
    assert sf.info(str(path)).frames == frames
    ffmpeg = shutil.which("ffmpeg")
    if ffmpeg is None:
        if os.environ.get("CI"):
            pytest.fail("ffmpeg is not installed: `make ffmpeg` installs Debian's package")
        pytest.skip("ffmpeg is not installed (`make ffmpeg`); wave and soundfile read the file")
    decoded = subprocess.run(
        [ffmpeg, "-v", "error", "-i", str(path), "-f", "s16le", "-"], capture_output=True, timeout=60
    )
    assert decoded.returncode == 0 and decoded.stderr == b"", decoded.stderr.decode()[-2000:]
    assert decoded.stdout == data[44:]  # ffmpeg reads exactly the samples the header states


def test_openai_example(served: Path) -> None:
    code = example("python", "client.audio.speech.create(")
    assert run([sys.executable, "-c", code], served) < LIMIT_S
    data = (served / "hello.mp3").read_bytes()
    assert data[:3] == b"ID3" or data[0] == 0xFF  # an MP3 stream: a tag or a frame sync


def test_say_example(served: Path) -> None:
    line = next(
        ln for b in blocks("bash") for ln in b.splitlines() if "voxstage say" in ln and "--voice ryan" in ln
    )
    assert run(["bash", "-c", line], served) < LIMIT_S
    assert (served / "hello.wav").read_bytes()[:4] == b"RIFF"
