"""``bench/duplex_engine_python.py``: the serving duplex codec engine ticks with ready model calls, and every
session's user codes and agent audio come out."""

from __future__ import annotations

from bench.duplex_engine_python import measure


def test_a_level_runs_the_engine_and_reports_its_cost() -> None:
    row = measure(sessions=4, ticks=3, repeats=1)
    assert row["sessions"] == 4 and row["cpu_us_per_session_tick"] > 0
