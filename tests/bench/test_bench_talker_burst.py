"""Smoke test of bench/talker_burst.py on the tiny preset: a burst's submits are timed one by one and every
request reaches its first frame (timing on this box is not a benchmark: only the shape and sanity)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import talker_burst


@pytest.mark.timeout(300)
def test_a_burst_is_taken_in_and_every_request_gets_a_frame(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VOXSTAGE_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "burst.json"
    assert talker_burst.main(["--out", str(out), "--streams", "4", "--repeats", "2"]) == 0
    doc = json.loads(out.read_text())
    assert doc["streams"] == 4 and len(doc["runs"]) == 2
    for run in doc["runs"]:
        assert 0 < run["submit_p50_ms"] <= run["submit_total_ms"]
        assert 0 < run["first_frame_p50_ms"] <= run["first_frame_max_ms"]
        assert run["ticks_to_all_first_frames"] >= 1
