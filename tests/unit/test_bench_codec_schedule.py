"""CPU smoke test of ``bench/codec_schedule.py`` on the tiny preset: every kind of arm runs on the stage's
engine and writes sane records. CPU decodes finish before they return and their speed is this machine's,
so what the arms measure is not compared here (the engine tests show each switch works:
``test_without_early_handout_the_async_step_waits_for_the_bulk_decode``, tests/unit/codec/
test_engine_deadline.py); only counts, shapes and each arm's settings are checked. One torch thread: on a
busy machine more only oversubscribe it (steps of seconds, too few streams started)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import codec_schedule

pytestmark = pytest.mark.timeout(120)


def test_codec_schedule_writes_both_arms(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("VOXSTAGE_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "r" / "codec_schedule.json"
    argv = ["--out", str(out), "--device", "cpu", "--quick", "--threads", "1",
            "--arms", "on,fifo-off,deadline:50,lanes:20:50",
            "--streams", "3", "--frames", "8", "--duration", "2", "--warmup", "0.5"]  # fmt: skip
    assert codec_schedule.main(argv) == 0
    report = json.loads(out.read_text())
    assert report["config"]["model"] == "qwen3-tts-tiny" and report["config"]["async_scheduling"] is True
    assert report["config"]["chunks"] == [1, 25] and report["torch"] and report["date"]
    settings = [(r["arm"], r["policy"], r["early_handout"], r["tick_budget_ms"]) for r in report["arms"]]
    assert settings == [
        ("on", "fifo", True, None),
        ("fifo-off", "fifo", False, None),
        ("deadline:50", "deadline", True, 50),
        ("lanes:20:50", "deadline", True, 50),
    ]
    assert [r["urgent_lane_ms"] for r in report["arms"]] == [None, None, None, 20]
    deadline = report["arms"][2]
    assert deadline["decode_cost"]["table_ms"] and 0 < deadline["tick_planned_ms"]["p50"]
    assert report["arms"][0]["decode_cost"] is None and report["arms"][0]["tick_planned_ms"] is None
    for r in report["arms"]:
        # 3 streams of 8 frames at 10 ms end in well under a second: many streams start in 2 s.
        assert r["streams_started"] > 3 and r["streams_unfinished"] == r["streams_without_audio"] == 0
        fa = r["first_audio_ms"]
        assert 0 < fa["p50"] <= fa["p95"] <= fa["p99"] <= fa["max"] < 2000
        assert r["chunk_gap_ms"]["max"] > 0 and r["steps"] > 0 and r["step_ms_mean"] > 0
        assert r["audio_s"] > 0 and r["audio_s_per_wall_s"] == pytest.approx(r["audio_s"] / 2)
        assert 0 <= r["underruns"] <= r["streams_started"] and r["graphs"] == 0  # CPU: eager
    assert "first audio ms" in capsys.readouterr().out


@pytest.mark.parametrize("arm", ["deadline:0", "deadline:x", "fifo:20", "edf", "lanes:10", "lanes:0:20"])
def test_bad_arms_are_refused(arm: str, tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        codec_schedule.main(["--out", str(tmp_path / "x.json"), "--device", "cpu", "--arms", arm])
    assert not (tmp_path / "x.json").exists()
