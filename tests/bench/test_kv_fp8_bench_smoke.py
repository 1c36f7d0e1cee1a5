"""CI smoke test of ``bench/kv_fp8.py`` on CPU with the tiny presets: it runs and writes sane JSON (error
entries for the golden fixtures and both tiny presets of the families with an fp8 cache, found through the
registry in its order; timing rows for both kv_cache_dtype values). CPU timing is not a benchmark: only the
shape of the results is checked."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(200)


def test_kv_fp8_bench_runs_on_cpu(tmp_path: Path) -> None:
    out = tmp_path / "kv.json"
    cmd = [sys.executable, "-m", "bench.kv_fp8", "--out", str(out), "--device", "cpu", "--size", "tiny"]
    cmd += ["--frames", "4", "--streams", "2", "--sessions", "1,2", "--iters", "2", "--threads", "1"]
    env = {**os.environ, "VOXSTAGE_CACHE": str(tmp_path / "cache")}
    subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True, timeout=180, env=env)
    result = json.loads(out.read_text())
    models = [e["model"] for e in result["errors"]]
    assert models == [
        "golden/qwen3_tts/custom_voice",
        "golden/personaplex/prompt_voice",
        "golden/personaplex/ring_window",
        "qwen3-tts-tiny",
        "personaplex-tiny",
    ]
    assert list(result["timing"]) == ["qwen3-tts-tiny", "personaplex-tiny"]
    for entry in result["errors"]:
        for method in ("weights", "amax", "unit"):
            assert entry[method]["cache"]["k"]["clipped_share"] == 0.0
            assert all(0 <= h["argmax_agreement"] <= 1 for h in entry[method]["teacher_forced"].values())
    for rows in result["timing"].values():
        assert {(r["kv_cache_dtype"], r["sessions"]) for r in rows} == {
            (kv, n) for kv in ("auto", "fp8") for n in (1, 2)
        }
        fp8 = {r["sessions"]: r["kv_gib"] for r in rows if r["kv_cache_dtype"] == "fp8"}
        plain = {r["sessions"]: r["kv_gib"] for r in rows if r["kv_cache_dtype"] == "auto"}
        assert all(fp8[n] * 4 == pytest.approx(plain[n]) for n in fp8)  # CPU models are fp32: 4 bytes -> 1
        assert all(r["frame"]["median_ms"] > 0 for r in rows)
