"""``bench/gil_handoff.py``: one arm measures the extra wait for the GIL beside a busy Python thread."""

from __future__ import annotations

import sys

from bench.gil_handoff import arm


def test_an_arm_reports_the_extra_wait_per_release() -> None:
    before = sys.getswitchinterval()
    try:
        result = arm(0.0005, 0.001, rounds=20)
    finally:
        sys.setswitchinterval(before)
    waits = result["extra_wait_ms"]
    assert result["interval_ms"] == 0.5 and set(waits) == {"p50", "p95", "p99", "max", "mean"}
    assert 0 <= waits["p50"] <= waits["max"]
