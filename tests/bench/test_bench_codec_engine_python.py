"""``bench/codec_engine_python.py``: the serving TTS codec engine (one lane and two) runs its ticks with a
ready decode, every stream that ends gets all its frames back, and the level reports its cost."""

from __future__ import annotations

import pytest

from bench.codec_engine_python import measure


@pytest.mark.parametrize(("policy", "lanes"), [("deadline", False), ("fifo", False), ("deadline", True)])
def test_a_level_runs_the_engine_and_reports_its_cost(policy: str, lanes: bool) -> None:
    row = measure(streams=8, frames=30, steps=40, repeats=1, policy=policy, lanes=lanes)
    assert row["policy"] == policy and row["lanes"] is lanes and row["cpu_us_per_stream_frame"] > 0
    # 8 streams of 30 frames over 30 + 40 steps: the first generation ended, every one with all its audio.
    assert row["streams_ended"] == row["streams_complete"] >= 8 and row["streams_opened"] > 8
    assert row["engine_ticks"] > 0
