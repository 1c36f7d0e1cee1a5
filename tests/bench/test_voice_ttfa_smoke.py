"""CI smoke test of ``bench/families/qwen3_tts/voice_ttfa.py`` on CPU with the tiny presets: the three
arms run through the served engines and write sane JSON, each part of the synced request owns its work, and
the clone arm reuses its voice's codec state. CPU timing is not a benchmark: only the shape of the results is
checked."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(180)


def test_voice_ttfa_bench_runs_on_cpu(tmp_path: Path) -> None:
    out = tmp_path / "voice_ttfa.json"
    script = ROOT / "bench" / "families" / "qwen3_tts" / "voice_ttfa.py"
    cmd = [sys.executable, str(script), "--out", str(out), "--device", "cpu", "--size", "tiny"]
    cmd += ["--requests", "2", "--warmup", "1", "--frames", "4"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True, timeout=160, env=env)
    result = json.loads(out.read_text())
    arms = {a["arm"]: a for a in result["arms"]}
    assert set(arms) == {"builtin", "clone", "xvector"}
    assert arms["builtin"]["codec_voice_states"] == 0 and arms["clone"]["codec_voice_states"] == 1
    assert arms["xvector"]["codec_voice_states"] == 0
    for arm in arms.values():
        assert len(arm["requests"]) == 2
        for r in arm["requests"]:
            assert 0 < r["first_frame_ms"] < r["ttfa_ms"] and r["first_pcm_ms"] > 0
        assert arm["profile"]["top_ops"] and arm["prompt_profile"]["ops_timed_by"] == "self_cpu_time_total"
        # Every part of the synced request ran, and its work (leaf ops on CPU) is counted inside it.
        phases = arm["phases"]
        assert set(phases) >= {"codec_open", "submit", "talker_to_first_frame", "codec_to_first_pcm"}
        for name in ("submit", "talker_to_first_frame", "codec_to_first_pcm"):
            assert phases[name]["kernels"] > 0 and 0 < phases[name]["busy_ms"] <= phases[name]["wall_ms"]
    for name in ("clone", "xvector"):
        assert set(result[f"{name}_minus_builtin_ms"]) == set(arms[name]["requests"][0])
