"""Reading the loop-lag histogram out of a level's Prometheus diff (bench/prom.py)."""

from __future__ import annotations

from bench.prom import LOOP_LAG, loop_lag

EDGES = ("0.001", "0.002", "0.005", "0.01", "0.02", "0.04", "0.08", "0.16", "0.32", "1.0", "+Inf")


def test_loop_lag_counts_the_probes_over_20_and_80_ms() -> None:
    # 100 probes: 90 within 1 ms, 6 within 20 ms, 3 within 40 ms, 1 at 0.16 s (cumulative buckets).
    cumulative = (90, 90, 92, 94, 96, 99, 99, 100, 100, 100, 100)
    d = {f'{LOOP_LAG}_bucket{{le="{le}"}}': float(c) for le, c in zip(EDGES, cumulative, strict=True)}
    d[f"{LOOP_LAG}_count"] = 100.0
    got = loop_lag(d)
    assert got == {"probes": 100.0, "p50": 0.001, "p99": 0.04, "over_20ms": 4.0, "over_80ms": 1.0}
    assert loop_lag({})["probes"] == 0
