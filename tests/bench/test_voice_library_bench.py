"""CPU smoke test of ``bench/voice_library.py`` (issue 30's H200 measurement): tiny presets, a short clip,
a few seconds per arm. It checks the harness end to end (stacks, uploads, the four arms, the summary's
shape); CPU timing is not a benchmark, so only sanity is asserted."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from bench import voice_library

pytestmark = pytest.mark.timeout(400)


def test_the_voice_library_bench_runs_its_four_arms(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VOXSTAGE_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "out"
    argv = ["--out", str(out), "--model", "qwen3-tts-tiny-base", "--builtin-model", "qwen3-tts-tiny",
            "--device", "cpu", "--threads", "1", "--rate", "2", "--duration", "6", "--rounds", "2",
            "--frames", "4", "--clip-seconds", "2", "--warmup-requests", "1",
            "--start-timeout", "150", "--stamps"]  # fmt: skip
    assert voice_library.main(argv) == 0
    doc = json.loads((out / "voice_library_tiny-base.json").read_text())
    assert doc["upload"]["id"].startswith("voice_")
    assert set(doc["arms"]) == {"uploaded", "uploaded_xvector", "inline", "builtin"}
    for arm in doc["arms"].values():
        assert arm["requests"] >= 1 and arm["ok"] == arm["requests"], arm
        ttfa = arm["ttfa_ms"]
        assert 0 < ttfa["min"] <= ttfa["p50"] <= ttfa["p95"] <= ttfa["max"]
        assert 0 < arm["server_ttfa_ms"]["p50"] <= ttfa["max"]  # the gateway's span is inside the client's
        assert len(arm["files"]) == len(arm["round_p50_ms"]) == 2  # the arms took turns, two rounds each
        assert all((out / name).exists() for name in arm["files"])
    diffs = {"uploaded-builtin_p50", "uploaded_xvector-builtin_p50", "inline-uploaded_p50"}
    assert diffs <= set(doc["diff_ms"])
    for pair, (lo, hi) in doc["diff_p50_interval_ms"].items():
        assert lo <= doc["diff_ms"][f"{pair}_p50"] <= hi, pair
    # --stamps: every arm's requests were followed through every process to their first audio.
    for arm in doc["arms"].values():
        path = arm["path"]
        assert path["requests"] >= 1
        after = path["after_open_ms"]
        assert {"codec.open", "talker.open", "talker.send", "codec.pcm", "gateway.pcm"} <= set(after)
        assert 0 < after["talker.open"] < after["talker.send"] < after["codec.pcm"] < after["gateway.pcm"]
    assert "gateway.open -> codec.open" in doc["path_diff_ms"]["uploaded-builtin"]


def test_the_p50_difference_interval_brackets_the_shift_and_narrows_with_requests() -> None:
    rng = np.random.default_rng(1)
    x, y = list(20 + rng.exponential(3, 400)), list(18 + rng.exponential(3, 400))
    lo, hi = voice_library.p50_diff_interval(x, y)
    assert lo < 2.0 < hi and hi - lo < 2.0
    lo_few, hi_few = voice_library.p50_diff_interval(x[:25], y[:25])
    assert hi_few - lo_few > hi - lo  # fewer requests, a wider interval


def test_an_unknown_arm_is_refused_before_any_stack_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--out", str(tmp_path), "--model", "qwen3-tts-tiny-base", "--arms", "uploaded,bogus"]
    with pytest.raises(SystemExit) as exc:
        voice_library.main(argv)
    assert exc.value.code == 2
    assert "--arms: unknown arm(s) bogus" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())
