"""The event-loop lag probe records a block of the loop as at least its length."""

from __future__ import annotations

import asyncio
import time

from voxstage import metrics
from voxstage.loop_lag import watch_loop_lag


def over(bound: float) -> float:
    """Observations above ``bound`` (a bucket edge) so far."""
    total = below = 0.0
    for metric in metrics.EVENT_LOOP_LAG.collect():
        for s in metric.samples:
            if s.name.endswith("_count"):
                total = s.value
            elif s.name.endswith("_bucket") and float(s.labels["le"]) == bound:
                below = s.value
    return total - below


async def test_a_blocked_loop_is_recorded_and_the_probe_runs_once_per_loop() -> None:
    probe = watch_loop_lag(interval_s=0.005)
    assert watch_loop_lag() is probe
    await asyncio.sleep(0.02)  # the probe is asleep in its interval
    before = over(0.08)
    time.sleep(0.12)  # noqa: ASYNC251 - the block under test: the loop cannot turn
    await asyncio.sleep(0.02)  # the probe wakes, late by the block
    assert over(0.08) == before + 1
    probe.cancel()
