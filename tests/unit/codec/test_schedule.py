"""The codec's tick plans (services/codec/schedule.py) and the cost model they plan with
(services/codec/decode_cost.py): ordering by deadline, the budget, merged calls. Costs are tables given here,
so nothing is timed; the engine tests run the same plans on the real tiny decoder."""

from __future__ import annotations

import pytest

from services.codec.decode_cost import STOP_AT_BUDGETS, DecodeCost, measure
from services.codec.schedule import (
    Row,
    batch_bucket,
    cheapest_calls,
    deadline_calls,
    fifo_calls,
    frame_bucket,
)

BUCKETS = (1, 2, 4, 8, 16, 25)
CAP = 64
MS = 1e-3


def launch_bound(rows: int, frames: int) -> float:
    """The shape of the H200's fp32 numbers (docs/benchmarks.md): 2.4 ms a call plus 66 us per row-frame."""
    return 2.4 * MS + 0.066 * MS * rows * frames


def row(name: str, frames: int, deadline: float, context: int = 0) -> Row[str]:
    return Row(name, frames, context, deadline)


def names(calls: list) -> list[list[str]]:  # type: ignore[type-arg]
    return [[r.stream for r in c.rows] for c in calls]


def test_fifo_takes_every_row_one_call_per_bucket() -> None:
    rows = [row("a", 25, 5.0), row("b", 1, 0.0), row("c", 3, 1.0), row("d", 25, 2.0)]
    calls = fifo_calls(rows, BUCKETS)
    assert [c.frames for c in calls] == [1, 4, 25] and names(calls) == [["b"], ["c"], ["a", "d"]]
    assert frame_bucket(30, BUCKETS) == 30 and frame_bucket(3, ()) == 3  # past the buckets: its own size


def test_the_most_urgent_rows_go_first_and_the_rest_wait() -> None:
    # 40 steady chunks of old streams (deadlines seconds away) and 3 young streams' next chunks (due now).
    bulk = [row(f"old{i}", 25, 10.0 + i) for i in range(40)]
    young = [row(f"young{i}", 1, 0.1 * i) for i in range(3)]
    calls, cost = deadline_calls([*bulk, *young], BUCKETS, launch_bound, 20 * MS, CAP)
    taken = {r for c in names(calls) for r in c}
    assert {"young0", "young1", "young2"} <= taken
    assert 0 < cost <= 20 * MS
    # The old streams taken are the most urgent ones: a prefix of the deadline order.
    old = sorted(int(n[3:]) for n in taken if n.startswith("old"))
    assert old == list(range(len(old))) and 0 < len(old) < 40


def test_a_tick_never_passes_the_budget_unless_one_row_alone_does() -> None:
    rows = [row(f"s{i}", 25, float(i)) for i in range(64)]
    for budget_ms in (5, 10, 20, 40, 80):
        calls, cost = deadline_calls(rows, BUCKETS, launch_bound, budget_ms * MS, CAP)
        assert cost == pytest.approx(
            sum(launch_bound(batch_bucket(len(c.rows), CAP), c.frames) for c in calls)
        )
        assert cost <= budget_ms * MS
    lone = [row("huge", 25, 0.0), row("next", 25, 1.0)]
    calls, cost = deadline_calls(lone, BUCKETS, launch_bound, 1 * MS, CAP)  # one row costs 4 ms: it goes
    assert names(calls) == [["huge"]] and cost > 1 * MS


def test_everything_goes_when_it_fits() -> None:
    rows = [row(f"s{i}", 25, float(i)) for i in range(8)] + [row("y", 1, 0.0)]
    calls, _ = deadline_calls(rows, BUCKETS, launch_bound, 1.0, CAP)
    assert sorted(r for c in names(calls) for r in c) == sorted(r.stream for r in rows)


def test_small_rows_ride_in_a_larger_calls_padding() -> None:
    # Five 25-frame rows pad to a batch of 8: three 1-frame rows fit in its spare rows for nothing, where a
    # call of their own would cost 2.4 ms of launches.
    rows = [row(f"s{i}", 25, float(i)) for i in range(5)] + [row(f"y{i}", 1, 0.0) for i in range(3)]
    calls, cost = cheapest_calls(rows, BUCKETS, launch_bound, CAP)
    assert len(calls) == 1 and calls[0].frames == 25 and len(calls[0].rows) == 8
    assert cost == pytest.approx(launch_bound(8, 25))
    assert cost < sum(
        launch_bound(batch_bucket(len(c.rows), CAP), c.frames) for c in fifo_calls(rows, BUCKETS)
    )


def test_merging_is_skipped_when_padding_costs_more() -> None:
    # One steady chunk and 60 first chunks: padding 60 rows to 25 frames costs far more than a 1-frame call.
    rows = [row("old", 25, 5.0)] + [row(f"y{i}", 1, 0.0) for i in range(60)]
    calls, _ = cheapest_calls(rows, BUCKETS, launch_bound, CAP)
    assert [(c.frames, len(c.rows)) for c in calls] == [(1, 60), (25, 1)]


def test_what_merging_frees_takes_more_waiting_rows() -> None:
    # Budget for one 8-row call of 25 frames: first pass takes 3 young 1-frame rows (a 2.4 ms call) and as
    # many old rows as fit beside them; merged, the young rows need no call of their own, which leaves room.
    budget = launch_bound(8, 25)
    rows = [row(f"y{i}", 1, 0.0) for i in range(3)] + [row(f"old{i}", 25, 1.0 + i) for i in range(10)]
    calls, cost = deadline_calls(rows, BUCKETS, launch_bound, budget, CAP)
    assert cost <= budget and [(c.frames, len(c.rows)) for c in calls] == [(25, 8)]
    assert names(calls)[0][:3] == ["y0", "y1", "y2"]


def test_context_frames_count_toward_a_rows_bucket() -> None:
    calls = fifo_calls([row("a", 4, 0.0, context=10)], BUCKETS)
    assert [c.frames for c in calls] == [16]


def test_the_cost_model_uses_its_table_and_bounds_what_it_lacks() -> None:
    table = {(b, t): launch_bound(b, t) for b in (1, 2, 4, 8) for t in (1, 25)}
    cost = DecodeCost(table)
    assert cost(4, 25) == table[(4, 25)]
    # Unmeasured: the affine fit of the table, never below a measured shape no larger in both dimensions.
    assert cost(16, 25) == pytest.approx(launch_bound(16, 25), rel=0.05)
    assert cost(8, 30) >= table[(8, 25)]
    with pytest.raises(ValueError, match="at least one"):
        DecodeCost({})


def test_calibration_grows_each_bucket_until_a_call_passes_twice_the_budget() -> None:
    timed: list[tuple[int, int]] = []

    def time_call(b: int, t: int) -> float:
        timed.append((b, t))
        return launch_bound(b, t)

    table = measure(time_call, [1, 2, 4, 8, 16, 32, 64], [1, 25], budget_s=10 * MS, max_frames=64 * 25)
    assert set(table) == set(timed)
    # 25 frames: 8 rows cost 15.6 ms (< 20), 16 rows 28.8 ms (past 2 budgets): nothing larger is timed.
    assert max(b for b, t in timed if t == 25) == 16 and launch_bound(16, 25) > STOP_AT_BUDGETS * 10 * MS
    assert max(b for b, t in timed if t == 1) == 64  # 1 frame never gets there
    few = measure(time_call, [1, 2, 4], [25], budget_s=1.0, max_frames=50)
    assert set(few) == {(1, 25), (2, 25)}  # shapes past max_frames have no graph: not timed
