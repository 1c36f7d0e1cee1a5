"""What one codec decode call costs on the device: a table measured at start-up, for the tick schedule.

The bounded-deadline schedule (``services.codec.schedule``) needs "device seconds of a decode of B rows x T
frames" before it launches one, to keep every tick under ``codec_tick_budget_ms``. That number is not
guessed: the codec's warm-up (``CodecEngine.calibrate``) times the very calls the engine makes (the CUDA
graph of each (batch bucket, frame bucket), captured as it is first timed, or the eager decode) on scratch
slots with every row's length 0, so no stream's state moves, and keeps the median of a few runs per shape.
On the H200 a 1 x 1 graph is about 2.4 ms and 64 x 25 about 106 ms in fp32 (docs/benchmarks.md, issue 14):
small calls are launch-bound, so cost is far from proportional to frames, which is why it is a table and not
a rate.

Shapes the table lacks (past the calibration's stop, or eager odd sizes) are estimated from an affine fit
``a + c * rows * frames`` over the measured ones, and never below a measured shape that is no larger in
both dimensions (cost grows with rows and with frames).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

import torch

# Calibration stops growing a frame bucket's batch once a call takes this many tick budgets: the bounded
# schedule never plans such a call (only a single row that alone exceeds the budget runs over it), and the
# fit covers the rest.
STOP_AT_BUDGETS = 2.0


class DecodeCost:
    """Estimated device seconds of one decode call, ``cost(rows, frames)`` (rows = the padded batch bucket,
    frames = the frame bucket), from measured ``table`` entries."""

    def __init__(self, table: dict[tuple[int, int], float]) -> None:
        if not table:
            raise ValueError("a decode cost table needs at least one measured shape")
        if any(b < 1 or t < 1 or s < 0 for (b, t), s in table.items()):
            raise ValueError(f"decode cost table has an invalid entry: {table}")
        self.table = dict(table)
        self._a, self._c = _affine_fit([(b * t, s) for (b, t), s in self.table.items()])
        self._memo: dict[tuple[int, int], float] = {}

    def __call__(self, rows: int, frames: int) -> float:
        key = (rows, frames)
        hit = self.table.get(key)
        if hit is not None:
            return hit
        est = self._memo.get(key)
        if est is None:
            floor = max((s for (b, t), s in self.table.items() if b <= rows and t <= frames), default=0.0)
            est = self._memo[key] = max(self._a + self._c * rows * frames, floor)
        return est

    def describe(self) -> str:
        return (
            f"{len(self.table)} shapes measured; fit {1e3 * self._a:.2f} ms + "
            f"{1e6 * self._c:.2f} us per frame-row"
        )

    def as_json(self) -> dict[str, Any]:
        return {
            "table_ms": {f"{b}x{t}": round(1e3 * s, 4) for (b, t), s in sorted(self.table.items())},
            "fit_ms": [1e3 * self._a, 1e3 * self._c],
        }


def _affine_fit(points: list[tuple[int, float]]) -> tuple[float, float]:
    """Least squares ``s = a + c * x`` with a, c >= 0 (a single point, or one x: a line through zero)."""
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(s for _, s in points) / n
    var = sum((x - mx) ** 2 for x, _ in points)
    if var == 0:
        return 0.0, my / mx
    c = max(0.0, sum((x - mx) * (s - my) for x, s in points) / var)
    return max(0.0, my - c * mx), c


def measure(
    time_call: Callable[[int, int], float],
    rows: Iterable[int],
    frames: Iterable[int],
    *,
    budget_s: float,
    max_frames: int | None = None,
    max_total_s: float = 20.0,
) -> dict[tuple[int, int], float]:
    """Time ``time_call(b, t)`` (device seconds of one call) over ``rows`` x ``frames``, each frame size's
    batches smallest first until a call passes ``STOP_AT_BUDGETS`` budgets, shapes over ``max_frames`` rows x
    frames skipped (those have no graph), and no new shape once ``max_total_s`` of wall time went by."""
    table: dict[tuple[int, int], float] = {}
    start = time.perf_counter()
    row_list = sorted(set(rows))
    for t in sorted(set(frames)):
        for b in row_list:
            if max_frames is not None and b * t > max_frames and table:
                break
            if table and time.perf_counter() - start > max_total_s:
                return table
            table[(b, t)] = cost = time_call(b, t)
            if cost > STOP_AT_BUDGETS * budget_s:
                break
    return table


def time_call(
    decode: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], Any],
    device: torch.device,
    num_groups: int,
    first_scratch: int,
    rows: int,
    frames: int,
    repeats: int,
) -> float:
    """Median device seconds of ``decode(codes, slots, lengths)`` for ``rows`` x ``frames``, every length 0
    (nothing advances) on the scratch slots from ``first_scratch`` on; one untimed run first."""
    codes = torch.zeros((rows, num_groups, frames), dtype=torch.int64, device=device)
    slots = torch.arange(first_scratch, first_scratch + rows, device=device)
    lengths = torch.zeros(rows, dtype=torch.int64, device=device)
    times = []
    for i in range(repeats + 1):
        if device.type == "cuda":
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            decode(codes, slots, lengths)
            end.record()
            end.synchronize()
            elapsed = begin.elapsed_time(end) / 1e3
        else:
            t0 = time.perf_counter()
            decode(codes, slots, lengths)
            elapsed = time.perf_counter() - t0
        if i:
            times.append(elapsed)
    return sorted(times)[len(times) // 2]
