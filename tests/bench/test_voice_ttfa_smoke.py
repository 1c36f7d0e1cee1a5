"""CI smoke test of ``bench/families/qwen3_tts/voice_ttfa.py`` on CPU with the tiny presets: the three
arms run through the served engines and write sane JSON, each part of the synced request owns its work, and
the clone arm reuses its voice's codec state. CPU timing is not a benchmark: only the shape of the results is
checked."""

from __future__ import annotations

from pathlib import Path

import pytest
from benchkit import run_family_bench

pytestmark = pytest.mark.timeout(180)


def test_voice_ttfa_bench_runs_on_cpu(tmp_path: Path) -> None:
    args = ("--device", "cpu", "--size", "tiny", "--requests", "2", "--warmup", "1", "--frames", "4")
    result = run_family_bench("qwen3_tts", "voice_ttfa.py", tmp_path / "voice_ttfa.json", *args, timeout=160)
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
