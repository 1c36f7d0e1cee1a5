"""CI smoke test of ``bench/families/qwen3_tts/prepare_cold.py`` on CPU with the tiny presets: the three arms
prepare their prompts hot, at new lengths and after a pause and write medians. CPU timing is not a
benchmark: only the shape of the results is checked."""

from __future__ import annotations

from pathlib import Path

import pytest
from benchkit import run_family_bench

pytestmark = pytest.mark.timeout(120)


def test_prepare_cold_bench_runs_on_cpu(tmp_path: Path) -> None:
    args = ("--requests", "2", "--pause", "0.01", "--threads", "1")
    result = run_family_bench(
        "qwen3_tts", "prepare_cold.py", tmp_path / "prepare_cold.json", *args, timeout=100
    )
    assert result["threads"] == 1 and set(result["arms"]) == {"builtin", "xvector", "icl"}
    for arm in result["arms"].values():
        kinds = ("hot", "varied", "cold")
        assert set(arm) == {f"{k}_{w}_ms" for k in kinds for w in ("wall", "cpu")}
        assert all(v > 0 for v in arm.values())
