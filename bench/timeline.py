"""Timelines of loaded ticks in both stage processes on one clock, and where their time goes (issues 27, 28).

A stack started with ``VOXSTAGE_TORCH_PROFILE=<dir>`` (``voxstage.stage.torch_profile``) profiles a window
when ``<dir>/window.json`` asks for one; both the talker and the codec read the same file, so their traces
cover the same wall-clock window. This tool writes that file and reads the traces back:

    python -m bench.timeline trigger DIR --in 2 --duration 2          # profile from 2 s from now, for 2 s
    python -m bench.timeline render DIR --out OUT/timeline            # OUT/timeline.png and .json

``render`` maps each trace onto the wall clock (``bench.timeline_trace``), picks one loaded tick per stage
(``--pick``: the tick nearest the median length by default) and draws, around each, four lanes: talker CPU
(the engine thread), talker GPU, codec CPU, codec GPU, colored by where the time went: the tick loop's
Python, torch ops, kernel launches, CUDA graph launches, waiting on the GPU; on the GPU, captured (graph)
kernels, eager (uncaptured) kernels, copies, and the time a launched kernel waited while the *other*
process's kernels ran. The JSON has the same split averaged over every tick in the window, and per process
GPU-ms and CPU-ms per second of audio served: audio from the codec's ``voxstage_audio_generated_seconds``
over its window (TTS), or ``--audio-s-per-s`` as the load client counted it (duplex sessions, where the
codec does not count).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from bench.playback import percentile
from bench.timeline_trace import (
    Interval,
    StageTrace,
    clip,
    intersect,
    load,
    meta_path,
    subtract,
    tick_breakdown,
    total,
    union,
)

WINDOW_FILE = "window.json"  # as voxstage.stage.torch_profile reads it
CPU_COLORS = {
    "python": ("#f3e3a3", "Python in the tick loop"),
    "ops": ("#f0a04b", "torch ops (CPU side)"),
    "launch": ("#9ad48b", "kernel launch / async copy"),
    "graph_launch": ("#2e8b57", "CUDA graph launch"),
    "sync_wait": ("#d9534f", "waiting on the GPU (sync)"),
}
GPU_COLORS = {
    "graph": ("#3b6fb6", "kernels from CUDA graphs"),
    "eager": ("#c0392b", "eager / uncaptured kernels"),
    "copy": ("#8e44ad", "memcpy / memset"),
    "other": ("#9e9e9e", "queued behind the other process's kernels"),
}


def write_window(folder: Path, start_unix_s: float, duration_s: float, wid: int, stack: bool = False) -> None:
    """Ask every armed stage reading ``folder`` for one window (written whole: a reader never sees half)."""
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".{WINDOW_FILE}.{os.getpid()}"
    spec = {"id": wid, "start_unix_s": start_unix_s, "duration_s": duration_s, "stack": stack}
    tmp.write_text(json.dumps(spec) + "\n")
    tmp.replace(folder / WINDOW_FILE)


def trace_files(folder: Path, wid: int) -> list[Path]:
    return sorted(folder.glob(f"*-w{wid}.trace.json")) + sorted(folder.glob(f"*-w{wid}.trace.json.gz"))


def wait_for_traces(folder: Path, wid: int, count: int, timeout_s: float) -> list[Path]:
    """The window's traces once ``count`` of them and their meta files are written (or what is there at the
    deadline)."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = [p for p in trace_files(folder, wid) if meta_path(p).exists()]
        if len(found) >= count or time.monotonic() > deadline:
            return found
        time.sleep(0.5)


def _stats(values: list[float]) -> dict[str, float | None]:
    return {q: percentile(values, p) for q, p in (("p50", 50), ("p90", 90), ("p99", 99))} | {
        "max": max(values, default=None),
        "mean": sum(values) / len(values) if values else None,
    }


def pick_tick(ticks: list[Interval], how: str) -> Interval | None:
    if not ticks:
        return None
    lengths = sorted(e - s for s, e in ticks)
    target = {"median": percentile(lengths, 50), "p90": percentile(lengths, 90), "max": lengths[-1]}[how]
    return min(ticks, key=lambda t: abs((t[1] - t[0]) - (target or 0.0)))


def process_summary(t: StageTrace, ticks: list[Interval], other_gpu: list[Interval]) -> dict[str, Any]:
    rows = [tick_breakdown(t, tick, other_gpu) for tick in ticks]
    keys = rows[0].keys() if rows else ()
    mean = {k: sum(r[k] for r in rows) / len(rows) for k in keys}
    tick_sum = sum(r["tick_ms"] for r in rows)
    w0, w1 = t.window
    busy = clip(t.lanes["busy"], w0, w1)
    queued = clip(t.lanes["queued"], w0, w1)
    window_ms = w1 - w0
    return {
        "pid": t.pid,
        "window_ms": window_ms,
        "engine_thread": t.meta.get("engine_thread"),
        "clock_offset_us": t.clock_offset_us,
        "clock_marker_residuals_us": [c - t.clock_offset_us for c in t.clock_checks_us],
        "ticks": {"count": len(rows), "ms": _stats([r["tick_ms"] for r in rows])},
        "tick_mean_ms": mean,
        "tick_share": {k: (sum(r[k] for r in rows) / tick_sum if tick_sum else None) for k in keys},
        "engine_busy_share": tick_sum / window_ms if window_ms else None,
        "gpu": {
            "ops": len(t.gpu),
            "kernels": sum(1 for op in t.gpu if op.kind == "kernel"),
            "busy_ms": total(busy),
            "busy_share": total(busy) / window_ms if window_ms else None,
            "graph_kernel_ms": sum(
                op.end - op.start for op in t.gpu if op.kind == "kernel" and op.source == "graph"
            ),
            "eager_kernel_ms": sum(
                op.end - op.start for op in t.gpu if op.kind == "kernel" and op.source == "eager"
            ),
            "copy_ms": sum(op.end - op.start for op in t.gpu if op.kind != "kernel"),
            "queued_ms": total(queued),
            "waiting_for_other_ms": total(intersect(queued, clip(other_gpu, w0, w1))),
        },  # fmt: skip
        "cpu": {
            "process_ms": 1e3 * t.meta["process_cpu_s"],
            "engine_thread_ms": 1e3 * t.meta["engine_thread_cpu_s"],
        },
        "counters": t.meta.get("counters", {}),
    }


def analyze(folder: Path, wid: int, *, audio_s_per_s: float | None, pick: str) -> tuple[dict[str, Any], Any]:
    """The summary of window ``wid`` in ``folder`` and what ``render`` needs."""
    paths = trace_files(folder, wid)
    if not paths:
        raise SystemExit(f"no traces of window {wid} in {folder}")
    metas = [json.loads(meta_path(p).read_text()) for p in paths]
    origin_us = min(m["start_unix_ns"] for m in metas) / 1e3
    traces: dict[str, StageTrace] = {}
    for path, meta in zip(paths, metas, strict=True):
        key = meta["role"] if meta["role"] not in traces else f"{meta['role']}-{meta['pid']}"
        traces[key] = load(path, origin_us)
    lo = max(t.window[0] for t in traces.values())
    hi = min(t.window[1] for t in traces.values())
    summary: dict[str, Any] = {
        "tool": "bench.timeline",
        "folder": str(folder),
        "window_id": wid,
        "origin_unix_s": origin_us / 1e6,
        "overlap_ms": max(0.0, hi - lo),
        "processes": {},
    }
    busy = {k: t.lanes["busy"] for k, t in traces.items()}
    picks: dict[str, Interval] = {}
    for key, t in traces.items():
        other = union(i for k, b in busy.items() if k != key for i in b)
        inside = [tk for tk in t.ticks if tk[0] >= lo and tk[1] <= hi] or t.ticks
        summary["processes"][key] = process_summary(t, inside, other)
        chosen = pick_tick(inside, pick)
        if chosen is not None:
            picks[key] = chosen
            summary["processes"][key]["picked_tick"] = {"pick": pick, "start_ms": chosen[0]} | tick_breakdown(
                t, chosen, other
            )
    both = [busy[k] for k in busy]
    if len(both) == 2:
        summary["gpu_both_busy_ms"] = total(intersect(clip(both[0], lo, hi), clip(both[1], lo, hi)))
    summary["audio"] = audio_rates(traces, audio_s_per_s)
    rate = summary["audio"]["audio_s_per_s"]
    for p in summary["processes"].values():
        seconds = p["window_ms"] / 1e3
        p["per_audio_s"] = (
            None
            if not rate or not seconds
            else {
                "gpu_ms": p["gpu"]["busy_ms"] / seconds / rate,
                "cpu_ms": p["cpu"]["process_ms"] / seconds / rate,
                "engine_thread_cpu_ms": p["cpu"]["engine_thread_ms"] / seconds / rate,
            }
        )
    return summary, (traces, picks, busy)


def audio_rates(traces: dict[str, StageTrace], client_rate: float | None) -> dict[str, Any]:
    """Audio seconds served per wall second over the window: the load client's count if given, else the
    codec's ``voxstage_audio_generated_seconds`` (TTS only)."""
    if client_rate is not None:
        return {"audio_s_per_s": client_rate, "source": "load client"}
    for key, t in traces.items():
        audio = t.meta.get("counters", {}).get("voxstage_audio_generated_seconds_total")
        seconds = (t.window[1] - t.window[0]) / 1e3
        if key.startswith("codec") and audio and seconds > 0:
            return {"audio_s_per_s": audio / seconds, "source": f"{key} voxstage_audio_generated_seconds"}
    return {"audio_s_per_s": None, "source": "none: pass --audio-s-per-s"}


def render(
    png: Path, traces: dict[str, StageTrace], picks: dict[str, Interval], busy: dict[str, list[Interval]]
) -> None:
    """One panel per picked tick; in each, a CPU and a GPU lane per process, on the shared clock."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    keys = sorted(traces, key=lambda k: (not k.startswith("talker"), k))  # talker lanes on top
    height = len(picks) * (1.3 + 0.5 * 2 * len(keys)) + 0.8
    fig, axes = plt.subplots(len(picks), 1, figsize=(15, height), squeeze=False)
    for ax, pkey in zip(axes[:, 0], [k for k in keys if k in picks], strict=True):
        t0, t1 = picks[pkey]
        pad = max(2.0, 0.2 * (t1 - t0))
        x0, x1 = t0 - pad, t1 + pad
        labels: dict[int, str] = {}
        for i, key in enumerate(keys):
            t = traces[key]
            other = union(iv for k, b in busy.items() if k != key for iv in b)
            y_cpu, y_gpu = 2 * (len(keys) - i) - 1, 2 * (len(keys) - i) - 2
            _bars(ax, clip(t.ticks, x0, x1), y_cpu, CPU_COLORS["python"][0], t0)
            runtime = union([*t.cpu["sync_wait"], *t.cpu["graph_launch"], *t.cpu["launch"]])
            _bars(ax, subtract(clip(t.cpu["ops"], x0, x1), runtime), y_cpu, CPU_COLORS["ops"][0], t0)
            for cat in ("launch", "graph_launch", "sync_wait"):
                _bars(ax, clip(t.cpu[cat], x0, x1), y_cpu, CPU_COLORS[cat][0], t0)
            queued = t.lanes["queued"]
            _bars(ax, clip(intersect(queued, other), x0, x1), y_gpu, GPU_COLORS["other"][0], t0, hatch="//")
            for cat in ("graph", "eager", "copy"):
                _bars(ax, clip(t.lanes[cat], x0, x1), y_gpu, GPU_COLORS[cat][0], t0)
            labels |= {y_cpu: f"{key} CPU (engine thread)", y_gpu: f"{key} GPU"}
        ax.set_yticks(sorted(labels), [labels[y] for y in sorted(labels)])
        ax.axvline(0, color="k", lw=0.8, ls="--")
        ax.axvline(t1 - t0, color="k", lw=0.8, ls="--")
        ax.set_xlim(x0 - t0, x1 - t0)
        ax.set_xlabel(f"ms from the start of the picked {pkey} tick (wall clock, both processes)")
        ax.set_title(f"one loaded {pkey} tick: {t1 - t0:.1f} ms", fontsize=10)
    handles = [Patch(color=c, label=label) for c, label in CPU_COLORS.values()]
    handles += [
        Patch(facecolor=c, label=label, hatch="//" if k == "other" else None)
        for k, (c, label) in GPU_COLORS.items()
    ]
    fig.legend(handles=handles, loc="lower center", ncol=5, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.8 / height, 1, 1))
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=130)
    plt.close(fig)


def _bars(ax: Any, spans: list[Interval], y: float, color: str, t0: float, hatch: str | None = None) -> None:
    if spans:
        ax.broken_barh([(s - t0, e - s) for s, e in spans], (y - 0.4, 0.8), facecolors=color, hatch=hatch,
                       edgecolor="#555555" if hatch else "none", linewidth=0.3)  # fmt: skip


def compress(paths: list[Path]) -> None:
    """Raw traces grow by megabytes a second: kept gzipped (``render`` reads either)."""
    for path in paths:
        if path.suffix == ".json":
            with path.open("rb") as src, gzip.open(str(path) + ".gz", "wb", compresslevel=6) as dst:
                dst.write(src.read())
            path.unlink()


def render_window(folder: Path, wid: int, out: Path, *, audio_s_per_s: float | None = None,
                  pick: str = "median") -> dict[str, Any]:  # fmt: skip
    summary, (traces, picks, busy) = analyze(folder, wid, audio_s_per_s=audio_s_per_s, pick=pick)
    png = out.with_suffix(".png")
    if picks:
        render(png, traces, picks, busy)
        summary["png"] = str(png)
    out.with_suffix(".json").write_text(json.dumps(summary, indent=1) + "\n")
    return summary


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.timeline", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    sub = ap.add_subparsers(dest="cmd", required=True)
    tr = sub.add_parser("trigger", help="ask the armed stages for a window")
    tr.add_argument("folder", type=Path)
    tr.add_argument("--in", dest="in_s", type=float, default=1.0, help="seconds from now to the start")
    tr.add_argument("--duration", type=float, default=2.0)
    tr.add_argument("--id", type=int, default=None, help="window id (default: the clock, unique)")
    tr.add_argument("--stack", action="store_true", help="Python stacks too (slows the ticks)")
    rd = sub.add_parser("render", help="PNG + JSON summary of a window's traces")
    rd.add_argument("folder", type=Path)
    rd.add_argument("--window", type=int, default=None, help="window id (default: the newest)")
    rd.add_argument("--out", type=Path, required=True, help="output prefix: PREFIX.png, PREFIX.json")
    rd.add_argument("--pick", choices=("median", "p90", "max"), default="median")
    rd.add_argument("--audio-s-per-s", type=float, default=None, help="audio served per second (client)")
    a = ap.parse_args(argv)
    if a.cmd == "trigger":
        wid = a.id if a.id is not None else int(time.time())
        write_window(a.folder, time.time() + a.in_s, a.duration, wid, a.stack)
        print(wid)
        return 0
    wid = a.window
    if wid is None:
        ids = [int(p.name.split("-w")[-1].split(".")[0]) for p in a.folder.glob("*-w*.meta.json")]
        if not ids:
            raise SystemExit(f"no windows in {a.folder}")
        wid = max(ids)
    summary = render_window(a.folder, wid, a.out, audio_s_per_s=a.audio_s_per_s, pick=a.pick)
    print(json.dumps({k: v for k, v in summary.items() if k != "processes"}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
