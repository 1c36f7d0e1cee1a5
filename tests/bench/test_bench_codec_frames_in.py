"""``bench/codec_frames_in.py``: every frame it sends through the serving relay or the worker is decoded, and
a round's pushes reach the engine thread together."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("through", ["relay", "worker"])
def test_every_frame_is_decoded(tmp_path: Path, through: str) -> None:
    out = tmp_path / "frames_in.json"
    cmd = [sys.executable, "-m", "bench.codec_frames_in", "--out", str(out), "--streams", "4"]
    cmd += ["--rounds", "12", "--interval-ms", "5", "--repeats", "1", "--through", through]
    subprocess.run(cmd, cwd=ROOT, check=True, timeout=300, capture_output=True)
    (run,) = json.loads(out.read_text())["runs"]
    assert run["through"] == through and run["errors"] == []
    assert run["audio_samples"] == 4 * 12 * run["samples_per_frame"]  # every frame decoded
    # A round's messages arrive in one turn of the event loop: one hand-off takes all their frames.
    assert run["handoffs_per_round"] == 1
    assert run["loop_cpu_us_per_frame"] > 0
