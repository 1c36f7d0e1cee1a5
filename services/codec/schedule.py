"""Which ready chunks a codec tick decodes, and in which calls (the deploy file's ``codec_tick_policy``).

Both policies get the tick's ready rows (one per stream: its next chunk) and return decode calls, each a
frame bucket and its rows; a row is right-padded to its call's bucket (``lengths`` keeps padding out of the
stream's state, so the audio is the same whatever the call).

``fifo`` (issue 14's schedule, kept for A/B): every ready row goes now, one call per frame bucket. A tick
then lasts as long as all the ready work: 64 steady 25-frame chunks are one call of ~106 ms on the H200 in
fp32, and a young stream's second chunk, due 80 ms after its first audio, waits behind it.

``deadline``, bounded ticks: rows are taken in order of their deadline, the moment the stream's player
runs dry (first audio + audio handed out; a stream without audio yet is due since it opened, so first
chunks lead, or as if it started now under ``codec_first_chunks: yield``: ``CodecEngine._deadline``),
while the tick's estimated device time (``DecodeCost``, measured at start-up) stays within
``codec_tick_budget_ms``. A row that does not fit waits for the next tick; a later, smaller one that still
fits (free padding rows of a batch bucket cost nothing) goes. The most urgent row always goes, alone if it
alone exceeds the budget. Then the calls are re-cut to cost least (``cheapest_calls``): a few 1-frame rows
ride in a 25-frame call's padding instead of paying a 2.4 ms call of their own, and the budget that frees
takes more waiting rows. So a young stream's next chunk never queues behind more than a budget's worth of
bulk work, and bulk work still goes in batches as large as the budget allows.

Issue 14's deadline policy lost to fifo on throughput (453 against 485-493 audio-s per s, docs/benchmarks.md)
because it held back chunks with slack even when the device had room, counted frames instead of device time,
and left the device idle while the next tick was prepared. This one never holds back a row that fits, counts
measured device time, merges calls, and the engine launches a tick before it collects the previous one
(``CodecEngine.step``), so the device always has the next tick queued.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, Literal, TypeVar

TickPolicy = Literal["fifo", "deadline"]
TICK_POLICIES: tuple[TickPolicy, ...] = ("fifo", "deadline")
FirstChunks = Literal["lead", "yield"]  # where a stream with no audio out yet ranks (CodecEngine._deadline)
FIRST_CHUNKS: tuple[FirstChunks, ...] = ("lead", "yield")

S = TypeVar("S")
Cost = Callable[[int, int], float]  # device seconds of one call: (padded rows, frame bucket)


@dataclass(frozen=True)
class Row(Generic[S]):
    """One stream's decode in a tick: ``frames`` new frames behind ``context`` frames decoded again."""

    stream: S
    frames: int
    context: int
    deadline: float  # perf_counter seconds; smaller goes first

    @property
    def length(self) -> int:
        return self.frames + self.context


@dataclass(frozen=True)
class Call(Generic[S]):
    frames: int  # the frame bucket every row is padded to
    rows: list[Row[S]]


def batch_bucket(n: int, cap: int) -> int:
    """The batch size ``n`` rows are padded to: the next power of two, at most ``cap``."""
    return min(1 << (n - 1).bit_length(), cap)


def frame_bucket(length: int, buckets: Sequence[int]) -> int:
    """The smallest bucket that holds ``length`` frames (sorted ``buckets``); the length itself past them."""
    return next((b for b in buckets if b >= length), length)


def fifo_calls(rows: Sequence[Row[S]], buckets: Sequence[int]) -> list[Call[S]]:
    """Every row now, one call per frame bucket, smallest first (a single batch padded to its longest row
    would make hundreds of 4-frame chunks pay for one stream's 100-frame catch-up)."""
    by_bucket: dict[int, list[Row[S]]] = {}
    for row in rows:
        by_bucket.setdefault(frame_bucket(row.length, buckets), []).append(row)
    return [Call(t, group) for t, group in sorted(by_bucket.items())]


def calls_cost(calls: Sequence[Call[S]], cost: Cost, cap: int) -> float:
    return sum(cost(batch_bucket(len(c.rows), cap), c.frames) for c in calls)


def cheapest_calls(
    rows: Sequence[Row[S]], buckets: Sequence[int], cost: Cost, cap: int
) -> tuple[list[Call[S]], float]:
    """``rows`` cut into calls of least estimated cost, and that cost. Rows are classed by their own frame
    bucket; a call takes a run of adjacent classes at the largest one's bucket."""
    classes = fifo_calls(rows, buckets)
    runs, total = _cheapest_runs([(c.frames, len(c.rows)) for c in classes], cost, cap)
    calls = [Call(classes[j].frames, [r for c in classes[i : j + 1] for r in c.rows]) for i, j in runs]
    return calls, total


def _cheapest_runs(
    classes: Sequence[tuple[int, int]], cost: Cost, cap: int
) -> tuple[list[tuple[int, int]], float]:
    """Dynamic programming over (frame bucket, rows) classes, ascending: the runs ``(first, last)`` of
    classes that make the calls of least total cost (a handful of classes per tick: cheap)."""
    k = len(classes)
    best = [0.0] + [float("inf")] * k
    cut = [0] * (k + 1)
    for j in range(1, k + 1):
        n = 0
        for i in range(j, 0, -1):  # the call holding classes i..j (1-based)
            n += classes[i - 1][1]
            c = best[i - 1] + cost(batch_bucket(n, cap), classes[j - 1][0])
            if c < best[j]:
                best[j], cut[j] = c, i
    runs: list[tuple[int, int]] = []
    j = k
    while j:
        runs.append((cut[j] - 1, j - 1))
        j = cut[j] - 1
    return runs[::-1], best[k]


def deadline_calls(
    rows: Sequence[Row[S]], buckets: Sequence[int], cost: Cost, budget_s: float, cap: int
) -> tuple[list[Call[S]], float]:
    """The bounded tick: rows by deadline while the estimated cost stays within ``budget_s`` (see the module
    docstring); returns the calls (smallest frame bucket first) and their estimated device seconds."""
    taken: dict[int, list[Row[S]]] = {}  # frame bucket -> the rows taken in it
    waiting: list[tuple[int, Row[S]]] = []
    total, any_taken = 0.0, False
    for row in sorted(rows, key=lambda r: r.deadline):
        # First pass: one call per bucket; a row costs what it adds to its bucket's call (0 in padding).
        t = frame_bucket(row.length, buckets)
        group = taken.setdefault(t, [])
        n = len(group)
        step = cost(batch_bucket(n + 1, cap), t) - (cost(batch_bucket(n, cap), t) if n else 0.0)
        if any_taken and total + step > budget_s:
            waiting.append((t, row))
            continue
        group.append(row)
        total, any_taken = total + step, True
    counts = {t: len(group) for t, group in taken.items() if group}
    runs, total = _cheapest_runs(sorted(counts.items()), cost, cap)
    full: set[int] = set()  # buckets where one more row did not fit: no later row of them will
    for t, row in waiting:  # second pass: what merging the calls freed, still in deadline order
        if t in full:
            continue
        counts[t] = counts.get(t, 0) + 1
        trial, trial_cost = _cheapest_runs(sorted(counts.items()), cost, cap)
        if trial_cost <= budget_s:
            taken[t].append(row)
            runs, total = trial, trial_cost
        else:
            counts[t] -= 1
            if not counts[t]:
                del counts[t]
            full.add(t)
    classes = sorted((t, group) for t, group in taken.items() if group)
    calls = [Call(classes[j][0], [r for _, g in classes[i : j + 1] for r in g]) for i, j in runs]
    return calls, total
