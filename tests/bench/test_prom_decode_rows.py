"""Reading the codec's decode calls out of a level's Prometheus diff (bench/prom.py): frame rows by part,
rows per call, and with two lanes each lane's calls and rows per call."""

from __future__ import annotations

from bench.prom import DECODE_CALLS, DECODE_FRAMES, LANE_CALLS, LANE_ROWS, decode_rows


def test_rows_by_part_and_by_lane() -> None:
    d = {f'{DECODE_FRAMES}{{part="{p}"}}': n for p, n in (("audio", 600.0), ("padding", 200.0))}
    d[DECODE_CALLS] = 10.0
    one_lane = decode_rows(d)
    assert one_lane["rows_per_call"] == 80.0 and one_lane["padding_share"] == 0.25 and "lanes" not in one_lane
    d |= {f'{LANE_CALLS}{{lane="urgent"}}': 8.0, f'{LANE_ROWS}{{lane="urgent"}}': 64.0}
    d |= {f'{LANE_CALLS}{{lane="bulk"}}': 2.0, f'{LANE_ROWS}{{lane="bulk"}}': 736.0}
    assert decode_rows(d)["lanes"] == {
        "urgent": {"calls": 8.0, "rows_per_call": 8.0},
        "bulk": {"calls": 2.0, "rows_per_call": 368.0},
    }
