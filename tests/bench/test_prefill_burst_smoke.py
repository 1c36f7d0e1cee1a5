"""CI smoke test of ``bench/families/personaplex/prefill_burst.py`` on CPU with the tiny preset: it runs the
serving prefill path for each arm and batch and writes sane JSON. CPU timing is not a benchmark: only the
shape of the results is checked."""

from __future__ import annotations

from pathlib import Path

import pytest
from benchkit import run_family_bench

pytestmark = pytest.mark.timeout(120)


def test_prefill_burst_bench_runs_on_cpu(tmp_path: Path) -> None:
    args = ("--device", "cpu", "--size", "tiny", "--batches", "1,3", "--iters", "1")
    result = run_family_bench("personaplex", "prefill_burst.py", tmp_path / "burst.json", *args, timeout=100)
    assert result["voice_rows"] > 0 and result["prompt_positions"] > result["voice_rows"]
    rows = [(r["arm"], r["batch"], r["positions"]) for r in result["results"]]
    n = result["prompt_positions"]
    assert rows == [
        ("served", 1, n),
        ("served", 3, 3 * n),
        ("host_voice", 1, n),
        ("host_voice", 3, 3 * n),
        ("graphed", 1, n),
        ("graphed", 3, 3 * n),
    ]
    assert result["prefill_graphs_captured"] == 0  # CPU: the padded path runs eagerly, nothing captured
    for r in result["results"]:
        assert all(r[part]["median_ms"] > 0 for part in ("call", "rows", "transformer"))
    for arm in ("served", "host_voice", "graphed"):
        assert result[f"profile_{arm}"]["top_ops"], arm
