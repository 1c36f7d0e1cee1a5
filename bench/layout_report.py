"""The layouts of ``bench/run_gpu.py --layout`` side by side (issue 31): ``layouts.json`` and ``layouts.md``.

    python -m bench.layout_report OUT

One row per model and layout (``bench/layouts.py``), from the files the run tagged ``<size>_<layout>``:

* TTFA at 1 req/s (Poisson) p50 / p95, and c=1 RTF p50 (``latency``);
* the most gap-free streams: the closed search's best level and what stopped it (``closed``);
* duplex sessions with zero late frames: the largest ``realtime`` level at which no session's player
  heard a late frame and no session failed, with the late frames of every level;
* GPU busy % per device: the mean of NVML's 1 s samples (``bench/procsample.py``) at that level (the
  closed search's best, or the duplex level above; the top level when none passed), per visible GPU.

Renders what the files hold and nothing else: a layout that was not run, or a phase that failed, shows –.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from bench.layouts import LAYOUTS, layout_of
from bench.pack_results import load_json


def _busy(level: dict[str, Any] | None) -> dict[str, float | None] | None:
    """Mean GPU busy % per device of one level's samples; None without samples (CPU, no NVML)."""
    gpu = ((level or {}).get("processes") or {}).get("gpu")
    if not gpu:
        return None
    return {dev: stats.get("mean") for dev, stats in sorted(gpu["busy_pct"].items())}


def _closed(doc: dict[str, Any] | None) -> dict[str, Any] | None:
    if not doc or not doc.get("search"):
        return None
    s = doc["search"]
    passed = [lv for lv in doc["levels"] if lv["verdict"]["pass"]]
    best = [lv for lv in passed if lv["level"] == s["best"]]
    at = (best or doc["levels"])[-1]
    return {
        "best": s["best"],
        "limited_by": s.get("limited_by"),
        "levels": [(lv["level"], lv["verdict"]["pass"]) for lv in doc["levels"]],
        "gpu_busy_pct": _busy(at),
        "gpu_busy_at": at["level"],
    }


def _duplex(doc: dict[str, Any] | None) -> dict[str, Any] | None:
    if not doc or not doc.get("levels"):
        return None
    levels = doc["levels"]
    clean = [lv for lv in levels if lv["client_late_frames"] == 0 and lv["errors"] == 0]
    at = max(clean, key=lambda lv: lv["sessions"]) if clean else max(levels, key=lambda lv: lv["sessions"])
    return {
        "most_sessions_without_late_frames": max((lv["sessions"] for lv in clean), default=0),
        "late_frames": {str(lv["sessions"]): lv["client_late_frames"] for lv in levels},
        "errors": {str(lv["sessions"]): lv["errors"] for lv in levels},
        "gpu_busy_pct": _busy(at),
        "gpu_busy_at": at["sessions"],
    }


def _agg(doc: dict[str, Any] | None) -> dict[str, Any] | None:
    return doc["levels"][0]["aggregate"] if doc and doc.get("levels") else None


def layout_summary(out: Path, tag: str) -> dict[str, Any]:
    s: dict[str, Any] = {}
    if a := _agg(load_json(out / f"ttfa_1rps_{tag}.json")):
        s["ttfa_1rps_ms"] = {p: 1e3 * a["ttfa_s"][p] for p in ("p50", "p95")}
        s["ttfa_1rps_underrun_rate"] = a["underrun_rate"]
    if a := _agg(load_json(out / f"c1_{tag}.json")):
        s["c1_rtf_p50"] = a["rtf"]["p50"]
    s["closed"] = _closed(load_json(out / f"closed_search_{tag}.json"))
    s["realtime"] = _duplex(load_json(out / f"realtime_{tag}.json"))
    serve = load_json(out / f"serve_{tag}.json") or {}
    s["slots"] = serve.get("slots")
    return s


def layout_tags(out: Path) -> list[str]:
    """The result tags of ``out`` that carry a layout, in the layouts' order."""
    stems = {p.name.split(".json")[0] for p in out.glob("*.json*")}
    tags = {
        s.removeprefix(prefix) for s in stems for prefix in ("serve_", "realtime_") if s.startswith(prefix)
    }
    placed = [(layout_of(t), t) for t in tags if layout_of(t)[1] is not None]
    order = list(LAYOUTS)
    return [t for _, t in sorted(placed, key=lambda x: (x[0][0], order.index(x[0][1].name)))]


def _fmt(x: float | None, digits: int = 1) -> str:
    return "–" if x is None else f"{x:.{digits}f}"


def _busy_text(busy: dict[str, float | None] | None, at: Any, unit: str) -> str:
    if not busy:
        return "–"
    devices = " / ".join(f"GPU {dev}: {_fmt(v, 0)}" for dev, v in busy.items())
    return f"{devices} (at {at:g} {unit})"


def row(tag: str, s: dict[str, Any]) -> list[str]:
    from bench.gpu_report import model_name  # gpu_report imports this module

    base, layout = layout_of(tag)
    placed = "–" if layout is None else f"{layout.name}: {layout.what}"
    t = s.get("ttfa_1rps_ms") or {}
    closed, rt = s.get("closed"), s.get("realtime")
    streams = "–" if not closed else f"{_fmt(closed['best'], 0)} ({closed['limited_by'] or '–'})"
    if rt:
        late = ", ".join(f"{n}: {k}" for n, k in rt["late_frames"].items())
        sessions = f"{rt['most_sessions_without_late_frames']} (late frames at {late})"
    else:
        sessions = "–"
    busy = _busy_text(closed["gpu_busy_pct"], closed["gpu_busy_at"], "streams") if closed else "–"
    if rt:
        busy = _busy_text(rt["gpu_busy_pct"], rt["gpu_busy_at"], "sessions")
    return [
        model_name(base),
        placed,
        f"{_fmt(t.get('p50'))} / {_fmt(t.get('p95'))}",
        _fmt(s.get("c1_rtf_p50"), 3),
        streams,
        sessions,
        busy,
    ]


HEAD = [
    "model",
    "layout",
    "TTFA @1 req/s p50 / p95 ms",
    "c=1 RTF p50",
    "most gap-free streams (closed)",
    "duplex sessions with zero late frames",
    "GPU busy % per device (mean)",
]


def markdown(summary: dict[str, dict[str, Any]]) -> str:
    if not summary:
        return ""
    rows = [HEAD, ["---"] * len(HEAD), *(row(tag, s) for tag, s in summary.items())]
    return "".join("| " + " | ".join(r) + " |\n" for r in rows)


def write_layout_report(out: Path) -> dict[str, dict[str, Any]]:
    """``layouts.json`` / ``layouts.md`` in ``out`` when it holds layout results; {} (and no file) if not."""
    summary = {tag: layout_summary(out, tag) for tag in layout_tags(out)}
    if summary:
        (out / "layouts.json").write_text(json.dumps(summary, indent=1) + "\n")
        (out / "layouts.md").write_text(markdown(summary))
    return summary


def main(argv: list[str] | None = None) -> int:
    args = argv if argv is not None else sys.argv[1:]
    if len(args) != 1:
        raise SystemExit("usage: python -m bench.layout_report OUT_DIR")
    summary = write_layout_report(Path(args[0]))
    print(markdown(summary) or f"no layout results in {args[0]}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
