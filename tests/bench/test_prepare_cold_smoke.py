"""CI smoke test of ``bench/families/qwen3_tts/prepare_cold.py`` on CPU with the tiny presets: the three arms
prepare their prompts hot and after a pause and write medians. CPU timing is not a benchmark: only the shape
of the results is checked."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(120)


def test_prepare_cold_bench_runs_on_cpu(tmp_path: Path) -> None:
    out = tmp_path / "prepare_cold.json"
    script = ROOT / "bench" / "families" / "qwen3_tts" / "prepare_cold.py"
    cmd = [sys.executable, str(script), "--out", str(out), "--requests", "2", "--pause", "0.01"]
    cmd += ["--threads", "1"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True, timeout=100, env=env)
    result = json.loads(out.read_text())
    assert result["threads"] == 1 and set(result["arms"]) == {"builtin", "xvector", "icl"}
    for arm in result["arms"].values():
        assert set(arm) == {"hot_wall_ms", "hot_cpu_ms", "cold_wall_ms", "cold_cpu_ms"}
        assert all(v > 0 for v in arm.values())
