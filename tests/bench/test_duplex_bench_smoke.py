"""CI smoke tests of the PersonaPlex benchmarks on CPU with the tiny preset: the frame-step benchmark and the
duplex load generator (a real ``voxstage serve`` stack) run and write sane JSON. CPU timing is not a
benchmark: only the shape of the results and the counts are checked."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(200)


def test_frame_step_benchmark_runs_on_cpu(tmp_path: Path) -> None:
    out = tmp_path / "pp.json"
    cmd = [
        sys.executable,
        "bench/families/personaplex/personaplex_gpu.py",
        "--out",
        str(out),
        "--size",
        "tiny",
        "--device",
        "cpu",
    ]
    cmd += ["--batches", "1,2", "--iters", "2", "--window", "64"]
    subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True, timeout=120)
    result = json.loads(out.read_text())
    rows = result["results"]
    assert {(r["batch"], r["fill"], r["sampled"]) for r in rows} == {
        (b, f, s) for b in (1, 2) for f in ("10pct", "100pct") for s in (False, True)
    }
    greedy = [r for r in rows if not r["sampled"]]
    assert all(r["frame"]["median_ms"] > 0 and r["mimi_encode"]["median_ms"] > 0 for r in greedy)


def test_duplex_loadgen_runs_against_a_real_stack(tmp_path: Path) -> None:
    out = tmp_path / "duplex.json"
    cmd = [sys.executable, "-m", "bench.duplex_loadgen", "--out", str(out), "--model", "personaplex-tiny"]
    cmd += ["--device", "cpu", "--levels", "2", "--seconds", "2"]
    env = {**os.environ, "VOXSTAGE_CACHE": str(tmp_path / "cache")}
    subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True, timeout=180, env=env)
    (level,) = json.loads(out.read_text())["levels"]
    assert level["sessions"] == 2 and level["errors"] == 0
    assert level["agent_frames"] >= 2 * 20  # about one agent frame per 80 ms user frame, per session
    assert level["talker_tick"]["count"] > 0 and level["response_latency"]["count"] > 0
