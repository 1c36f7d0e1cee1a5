"""A request's way to its first audio, hop by hop, from the stamps ``bench/stamp_hook`` writes into a
stack's log (``STAMP <perf_counter> <pid> <point> <request id>``, one clock for every process of the host).

``env()`` is the environment a stamped stack starts with; ``requests`` joins a log's stamps by request id;
``summary`` gives, over a set of requests, each point's time after the gateway's ``open`` and each hop
between consecutive points (medians and means, ms), in the order the points come.
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Iterable
from typing import Any

from bench.stack import REPO

HOOK = REPO / "bench" / "stamp_hook"
START = "gateway.open"


def env() -> dict[str, str]:
    """``PYTHONPATH`` with the hook first, ahead of what the stack needs anyway (a device box's packages)."""
    rest = os.environ.get("PYTHONPATH", "")
    return {"PYTHONPATH": os.pathsep.join(p for p in (str(HOOK), rest) if p)}


def stamps(log: str) -> list[tuple[float, str, str]]:
    """``(time, point, request id)`` of every stamp line, in time order (``-``: no request id). A stamp
    under another name of a request (an ``ALIAS <name> <request id>`` line: the talker engine's take key)
    counts as the request's."""
    out, alias = [], {}
    for line in log.splitlines():
        parts = line.split()
        if parts[:1] == ["STAMP"] and len(parts) >= 4:
            out.append((float(parts[1]), parts[3], parts[4] if len(parts) > 4 else "-"))
        elif parts[:1] == ["ALIAS"] and len(parts) == 3:
            alias[parts[1]] = parts[2]
    return sorted((t, point, alias.get(rid, rid)) for t, point, rid in out)


def requests(log: str, windows: Iterable[tuple[float, float]] = ()) -> dict[str, dict[str, float]]:
    """Request id -> {point: its first time}, for the requests whose ``gateway.open`` falls in one of
    ``windows`` (``perf_counter`` spans; none given: every request)."""
    spans = list(windows)
    out: dict[str, dict[str, float]] = {}
    for t, point, rid in stamps(log):
        if rid == "-":
            continue
        if point == START and spans and not any(lo <= t <= hi for lo, hi in spans):
            continue
        if point != START and rid not in out:
            continue  # a request that opened outside the windows (or before the log began)
        out.setdefault(rid, {}).setdefault(point, t)
    return out


def summary(reqs: dict[str, dict[str, float]]) -> dict[str, Any]:
    """Each point's time after ``gateway.open`` and each hop between consecutive points, ms, over the
    requests that reached every point most of them reached (a request cut short would skew the hops; a
    point most requests pass by, such as the prefill of a prompt the prefix cache holds, is left out)."""
    counts: dict[str, int] = {}
    for r in reqs.values():
        for p in r:
            counts[p] = counts.get(p, 0) + 1
    seen = {p for p, n in counts.items() if 2 * n > len(reqs)}
    full = [{p: r[p] for p in seen} for r in reqs.values() if seen <= set(r) and START in r]
    if not full:
        return {"requests": 0}
    after = {p: [1e3 * (r[p] - r[START]) for r in full] for p in seen}
    order = sorted(seen, key=lambda p: statistics.median(after[p]))
    hops = {}
    for a, b in zip(order, order[1:], strict=False):
        ms = [1e3 * (r[b] - r[a]) for r in full]
        hops[f"{a} -> {b}"] = {"p50": round(statistics.median(ms), 3), "mean": round(statistics.fmean(ms), 3)}
    return {
        "requests": len(full),
        "after_open_ms": {p: round(statistics.median(after[p]), 3) for p in order},
        "hops_ms": hops,
    }


def diff(a: dict[str, Any], b: dict[str, Any]) -> dict[str, float]:
    """``a - b`` of each hop's p50 both summaries have (ms)."""
    ha, hb = a.get("hops_ms", {}), b.get("hops_ms", {})
    return {hop: round(ha[hop]["p50"] - hb[hop]["p50"], 3) for hop in ha if hop in hb}
