"""One stage process's profiler window (``voxstage.stage.torch_profile``) read onto the wall clock, and where
its ticks' time went (issues 27 and 28).

A trace's event times are microseconds from its ``baseTimeNanoseconds``; the window's ``voxstage.clock <unix
ns>`` markers carry ``time.time_ns()`` taken just before each was recorded, so ``embedded - (base + ts)``
is this trace's offset from the wall clock, give or take the time to enter a range (tens of µs). Every time
below is ms on the wall clock from an origin the caller picks (one origin for both processes: one clock).

The engine thread's time in a tick is split, each instant counted once, in this order:

* ``sync_wait``: CUDA runtime calls that block the thread until the GPU is done (``*Synchronize``, blocking
  ``cudaMemcpy``) and the sync events where the profiler records them: waiting for kernels, its own and
  whatever the GPU ran before them;
* ``graph_launch``: ``cudaGraphLaunch`` (a captured step replayed);
* ``launch``: the other runtime/driver calls (eager kernel launches, async copies);
* ``torch_ops``: the rest of the time inside top-level torch ops (dispatch, and on CPU the compute itself);
* ``python``: the rest of the tick: the Python of the tick loop between ops.

On the GPU: each kernel, memcpy or memset is ``graph`` (its launch was a graph launch) or ``eager`` (an
uncaptured shape, a ramp chunk, a prefill); the time a launched kernel waited to start (from its launch or
the end of the previous work on its stream, whichever is later) is ``queued``, and the part of that during
which the *other* process's kernels ran is ``waiting_for_other``: the cost of two processes time-slicing
one GPU.
"""

from __future__ import annotations

import gzip
import json
from bisect import bisect_left
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

TICK_RANGE = "voxstage.tick"  # as voxstage.stage.torch_profile writes them (bench imports no stage code)
CLOCK_RANGE = "voxstage.clock"
GPU_CATS = {"kernel": "kernel", "gpu_memcpy": "memcpy", "gpu_memset": "memset"}
LAUNCHER_CATS = ("cuda_runtime", "cuda_driver")
SYNC_CAT = "cuda_sync"

Interval = tuple[float, float]
Launches = dict[int, tuple[str, float]]  # correlation id -> (launcher name, its start in ms)


def union(intervals: Iterable[Interval]) -> list[Interval]:
    out: list[Interval] = []
    for s, e in sorted(i for i in intervals if i[1] > i[0]):
        if out and s <= out[-1][1]:
            if e > out[-1][1]:
                out[-1] = (out[-1][0], e)
        else:
            out.append((s, e))
    return out


def total(intervals: Sequence[Interval]) -> float:
    return sum(e - s for s, e in intervals)


def clip(intervals: Sequence[Interval], lo: float, hi: float) -> list[Interval]:
    """The parts of sorted, disjoint ``intervals`` inside ``[lo, hi]``."""
    out: list[Interval] = []
    k = max(0, bisect_left(intervals, (lo, lo)) - 1)
    for s, e in intervals[k:]:
        if s >= hi:
            break
        if e > lo:
            out.append((max(s, lo), min(e, hi)))
    return out


def intersect(a: Sequence[Interval], b: Sequence[Interval]) -> list[Interval]:
    """Both sorted and disjoint."""
    out: list[Interval] = []
    i = j = 0
    while i < len(a) and j < len(b):
        s, e = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if e > s:
            out.append((s, e))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def subtract(a: Sequence[Interval], b: Sequence[Interval]) -> list[Interval]:
    """``a`` minus ``b``, both sorted and disjoint."""
    out: list[Interval] = []
    j = 0
    for s, e in a:
        cur = s
        while j < len(b) and b[j][1] <= cur:
            j += 1
        k = j
        while k < len(b) and b[k][0] < e:
            if b[k][0] > cur:
                out.append((cur, b[k][0]))
            cur = max(cur, b[k][1])
            k += 1
        if cur < e:
            out.append((cur, e))
    return out


@dataclass
class GpuOp:
    start: float
    end: float
    kind: str  # kernel / memcpy / memset
    source: str  # graph / eager
    stream: int
    ready: float  # when it could have started: its launch, or its stream's previous op's end


@dataclass
class StageTrace:
    role: str
    pid: int
    meta: dict[str, Any]
    window: Interval  # ms, the meta's wall window
    clock_offset_us: float
    clock_checks_us: list[float]
    engine_tid: int | None
    ticks: list[Interval]
    cpu: dict[str, list[Interval]]  # engine thread, by category (overlapping across categories)
    gpu: list[GpuOp] = field(default_factory=list)

    @cached_property
    def lanes(self) -> dict[str, list[Interval]]:
        """The GPU side as sorted disjoint intervals, built once (a loaded window holds ~10^5 ops): ``busy``
        (anything), ``graph`` / ``eager`` kernels, ``copy``, and ``queued`` (launched, not started)."""
        kernels = [op for op in self.gpu if op.kind == "kernel"]
        return {
            "busy": union((op.start, op.end) for op in self.gpu),
            "graph": union((op.start, op.end) for op in kernels if op.source == "graph"),
            "eager": union((op.start, op.end) for op in kernels if op.source == "eager"),
            "copy": union((op.start, op.end) for op in self.gpu if op.kind != "kernel"),
            "queued": union((op.ready, op.start) for op in self.gpu),
        }


def _launcher_category(name: str) -> str:
    """A CUDA runtime/driver call's share of the engine thread: blocking, a graph replay, or a launch."""
    if "Synchronize" in name or name in ("cudaMemcpy", "cuMemcpyDtoH_v2", "cuMemcpy"):
        return "sync_wait"
    return "graph_launch" if "GraphLaunch" in name else "launch"


def meta_path(trace: Path) -> Path:
    """``<role>-<pid>-w<id>.meta.json`` beside its ``.trace.json`` (or ``.trace.json.gz``)."""
    return trace.with_name(trace.name.split(".trace.json")[0] + ".meta.json")


def load(trace_path: Path, origin_us: float) -> StageTrace:
    """Read ``<role>-<pid>-w<id>.trace.json[.gz]`` and its meta file; times in ms from ``origin_us`` (µs on
    the wall clock)."""
    meta = json.loads(meta_path(trace_path).read_text())
    raw = trace_path.read_bytes()
    doc = json.loads(gzip.decompress(raw) if trace_path.suffix == ".gz" else raw)
    events = [e for e in doc.get("traceEvents", []) if e.get("ph") == "X" and "ts" in e]
    base_us = int(doc.get("baseTimeNanoseconds", 0)) / 1e3 - origin_us
    checks = []
    for e in events:
        if e.get("name", "").startswith(CLOCK_RANGE + " "):
            embedded_us = int(e["name"].split()[1]) / 1e3 - origin_us
            checks.append(embedded_us - (base_us + float(e["ts"])))
    offset = min(checks, key=abs) if checks else 0.0

    def ms(ts: float) -> float:
        return (base_us + offset + ts) / 1e3

    ticks: list[Interval] = []
    tid: int | None = None
    for e in events:
        if e.get("name", "").startswith(TICK_RANGE + " "):
            tid = e.get("tid") if tid is None else tid
            ticks.append((ms(e["ts"]), ms(e["ts"] + e.get("dur", 0))))
    ticks.sort()
    cpu: dict[str, list[Interval]] = {"ops": [], "sync_wait": [], "graph_launch": [], "launch": []}
    launches: Launches = {}
    gpu_raw: list[tuple[dict[str, Any], str]] = []
    for e in events:
        cat = str(e.get("cat", "")).lower()
        span = (ms(e["ts"]), ms(e["ts"] + e.get("dur", 0)))
        if cat in GPU_CATS:
            gpu_raw.append((e, GPU_CATS[cat]))
        elif cat in LAUNCHER_CATS:
            name = str(e.get("name", ""))
            corr = (e.get("args") or {}).get("correlation")
            if corr is not None:
                launches[int(corr)] = (name, span[0])
            if e.get("tid") == tid:
                cpu[_launcher_category(name)].append(span)
        elif cat == SYNC_CAT and e.get("tid") == tid:
            cpu["sync_wait"].append(span)
        elif cat == "cpu_op" and e.get("tid") == tid:
            cpu["ops"].append(span)
    window = (
        (meta["start_unix_ns"] / 1e3 - origin_us) / 1e3,
        (meta["end_unix_ns"] / 1e3 - origin_us) / 1e3,
    )
    return StageTrace(
        meta["role"], meta["pid"], meta, window, offset, checks, tid, ticks,
        {k: union(v) for k, v in cpu.items()}, _gpu_ops(gpu_raw, launches, ms),
    )  # fmt: skip


def _gpu_ops(
    raw: list[tuple[dict[str, Any], str]],
    launches: dict[int, tuple[str, float]],
    ms: Callable[[float], float],
) -> list[GpuOp]:
    """GPU activities in start order, each with its source (graph / eager) and the time it was ready."""
    ops: list[GpuOp] = []
    stream_free: dict[int, float] = {}  # when the stream's previous op ended
    for e, kind in sorted(raw, key=lambda x: x[0]["ts"]):
        args = e.get("args") or {}
        corr = args.get("correlation")
        launcher, launched = launches.get(int(corr), ("", None)) if corr is not None else ("", None)
        stream = int(args.get("stream", e.get("tid", 0)) or 0)
        start, end = ms(e["ts"]), ms(e["ts"] + e.get("dur", 0))
        known = [x for x in (launched, stream_free.get(stream)) if x is not None]
        ready = min(max(known), start) if known else start
        # Kineto names a replayed graph's kernels by their launch, and newer versions by a graph id too.
        source = "graph" if "GraphLaunch" in launcher or args.get("graph id") else "eager"
        ops.append(GpuOp(start, end, kind, source, stream, ready))
        stream_free[stream] = max(end, stream_free.get(stream, end))
    return ops


def tick_breakdown(t: StageTrace, tick: Interval, other_gpu: Sequence[Interval]) -> dict[str, float]:
    """ms of one tick by category (see the module docstring), plus the GPU's side of it."""
    lo, hi = tick
    span = [(lo, hi)]
    sync = clip(t.cpu["sync_wait"], lo, hi)
    graph = subtract(clip(t.cpu["graph_launch"], lo, hi), sync)
    launch = subtract(subtract(clip(t.cpu["launch"], lo, hi), sync), graph)
    runtime = union([*sync, *graph, *launch])
    ops = subtract(clip(t.cpu["ops"], lo, hi), runtime)
    python = subtract(subtract(span, runtime), ops)
    lanes = {k: clip(v, lo, hi) for k, v in t.lanes.items()}
    other = clip(other_gpu, lo, hi)
    return {
        "tick_ms": hi - lo,
        "python_ms": total(python),
        "torch_ops_ms": total(ops),
        "launch_ms": total(launch),
        "graph_launch_ms": total(graph),
        "sync_wait_ms": total(sync),
        "sync_wait_other_gpu_ms": total(intersect(subtract(sync, lanes["busy"]), other)),
        "gpu_busy_ms": total(lanes["busy"]),
        "gpu_graph_ms": total(lanes["graph"]),
        "gpu_eager_ms": total(lanes["eager"]),
        "gpu_memcpy_ms": total(lanes["copy"]),
        "gpu_queued_ms": total(lanes["queued"]),
        "gpu_waiting_for_other_ms": total(intersect(lanes["queued"], other)),
    }
