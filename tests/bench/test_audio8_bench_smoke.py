"""CI smoke test of the Audio8 engine benchmark on CPU with the tiny preset: it runs and writes sane JSON.
CPU timing is not a benchmark: only the shape of the results is checked."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(200)


def test_audio8_engine_benchmark_runs_on_cpu(tmp_path: Path) -> None:
    out = tmp_path / "a8.json"
    cmd = [
        sys.executable,
        "bench/families/audio8_tts/audio8_gpu.py",
        "--out",
        str(out),
        "--size",
        "audio8-tts-tiny",
    ]
    cmd += ["--device", "cpu", "--batches", "1,2", "--iters", "2"]
    env = {**os.environ, "VOXSTAGE_CACHE": str(tmp_path / "cache")}
    subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True, timeout=180, env=env)
    report = json.loads(out.read_text())
    talker = report["talker_frame_step"]
    assert set(talker["eager"]) == {"1", "2"} and talker["graph_matches_eager"] is True
    for dtype in ("float32", "bfloat16"):
        rows = report["codec"][dtype]
        assert {"b1_t1", "b2_t25", "b2_t25_overlap_crop_25"} <= set(rows)
        assert all(r["audio_s_per_gpu_s"] > 0 for r in rows.values())
    assert 0 < report["codec"]["bf16_vs_fp32"]["rel_rms"] < 0.5
    assert report["work_ratio_codec_over_talker"] > 0
