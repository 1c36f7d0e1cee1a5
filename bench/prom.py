"""Prometheus text snapshots of a stack's processes, diffed over a load level: counters and histogram
quantiles of what happened during the level only.

Histogram quantiles are bucket upper bounds (as Prometheus' ``histogram_quantile`` would bound them): a tick
p99 of 0.06 means "at most 60 ms", to the resolution of ``voxstage.metrics``' buckets.
"""

from __future__ import annotations

import math
import urllib.error
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING, Any

from voxstage.metrics import DECODE_PARTS

if TYPE_CHECKING:
    from bench.stack import Stack

QUANTILES = (0.5, 0.95, 0.99)


def parse_prom(text: str) -> dict[str, float]:
    """``{'name{labels}': value}`` of every sample line (comments and unparsable values skipped)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            try:
                out[key] = float(value)
            except ValueError:
                continue
    return out


def diff(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    return {k: v - before.get(k, 0.0) for k, v in after.items()}


def hist_quantiles(d: dict[str, float], name: str, labels: str = "") -> dict[str, float | None]:
    """``count`` and p50/p95/p99 (upper bucket bounds) of a histogram's bucket diffs whose labels contain
    ``labels`` (e.g. ``'stage="talker"'``)."""
    buckets = []
    for key, count in d.items():
        if key.startswith(name + "_bucket{") and labels in key:
            le = key.split('le="')[1].split('"')[0]
            buckets.append((math.inf if le == "+Inf" else float(le), count))
    buckets.sort()
    total = buckets[-1][1] if buckets else 0
    result: dict[str, float | None] = {"count": total}
    for q in QUANTILES:
        bound = next((le for le, c in buckets if total and c >= q * total), None)
        result[f"p{round(q * 100)}"] = bound
    return result


def hist_over(d: dict[str, float], name: str, bound: float, labels: str = "") -> float:
    """Observations of a histogram's bucket diffs above ``bound``, which must be one of its bucket edges."""
    total = below = 0.0
    for key, count in d.items():
        if key.startswith(name + "_bucket{") and labels in key:
            le = key.split('le="')[1].split('"')[0]
            if le == "+Inf":
                total += count
            elif float(le) == bound:
                below += count
    return total - below


LOOP_LAG = "voxstage_event_loop_lag_seconds"


def loop_lag(d: dict[str, float]) -> dict[str, float | None]:
    """A process's event-loop probes (voxstage.loop_lag) in ``d``: p50/p99, and how many woke over 20 and
    over 80 ms late (80 ms: a whole duplex frame)."""
    q = hist_quantiles(d, LOOP_LAG)
    return {
        "probes": q["count"],
        "p50": q["p50"],
        "p99": q["p99"],
        "over_20ms": hist_over(d, LOOP_LAG, 0.02),
        "over_80ms": hist_over(d, LOOP_LAG, 0.08),
    }


def counter(d: dict[str, float], name: str) -> float:
    """A counter's total over all its label sets."""
    return sum(v for k, v in d.items() if k == name + "_total" or k.startswith(name + "_total{"))


def scrape(stack: Stack, tag: str, folder: Path) -> dict[str, dict[str, float]]:
    """Every process's /metrics now, kept as ``<folder>/<tag>_<process>.prom`` and parsed."""
    stack.scrape(folder / tag)
    return {
        path.name.removeprefix(f"{tag}_").removesuffix(".prom"): parse_prom(path.read_text())
        for path in sorted(folder.glob(f"{tag}_*.prom"))
    }


def parse_urls(text: str) -> dict[str, str]:
    """``codec=http://h:p/metrics,talker=...`` -> ``{name: url}`` (the form ``format_urls`` writes)."""
    out: dict[str, str] = {}
    for item in (x for x in text.split(",") if x.strip()):
        name, sep, url = item.partition("=")
        if not sep or not name.strip() or not url.startswith("http"):
            raise ValueError(f"{item!r}: expected NAME=http://HOST:PORT/metrics")
        out[name.strip()] = url.strip()
    return out


def format_urls(urls: dict[str, str]) -> str:
    return ",".join(f"{name}={url}" for name, url in urls.items())


def read_metrics(url: str) -> str:
    """One process's /metrics text; a failed scrape is a comment saying why (it parses as no samples)."""
    try:
        with urllib.request.urlopen(url, timeout=5.0) as r:
            return r.read().decode()
    except (urllib.error.URLError, OSError) as exc:
        return f"# scrape failed: {exc}\n"


def fetch(urls: dict[str, str]) -> dict[str, dict[str, float]]:
    """Each named process's /metrics now, parsed (empty where the scrape failed)."""
    return {name: parse_prom(read_metrics(url)) for name, url in urls.items()}


CHUNK_WAIT = "voxstage_codec_chunk_wait_seconds"
CHUNK_DECODE = "voxstage_codec_chunk_decode_seconds"
LATE_CHUNK = "voxstage_codec_late_chunk_seconds"
TICK = "voxstage_stage_tick_seconds"
DECODE_FRAMES = "voxstage_codec_decode_frames_total"
DECODE_CALLS = "voxstage_codec_decode_calls_total"
LANE_CALLS = "voxstage_codec_lane_calls_total"
LANE_ROWS = "voxstage_codec_lane_rows_total"


def decode_rows(d: dict[str, float]) -> dict[str, Any]:
    """The codec's decode calls over a level (a diff of its metrics): frame rows by part, calls, the
    padding's share of the rows computed and the rows per call, and with two lanes each lane's."""
    parts = {p: d.get(f'{DECODE_FRAMES}{{part="{p}"}}', 0.0) for p in DECODE_PARTS}
    calls = d.get(DECODE_CALLS, 0.0)
    total = sum(parts.values())
    out: dict[str, Any] = {
        **parts,
        "calls": calls,
        "padding_share": parts["padding"] / total if total else None,
        "rows_per_call": total / calls if calls else None,
    }
    lanes = {}  # with two lanes (codec_urgent_lane_ms): each lane's calls and rows per call
    for lane in ("urgent", "bulk"):
        n, rows = d.get(f'{LANE_CALLS}{{lane="{lane}"}}', 0.0), d.get(f'{LANE_ROWS}{{lane="{lane}"}}', 0.0)
        if n:
            lanes[lane] = {"calls": n, "rows_per_call": rows / n}
    if lanes:
        out["lanes"] = lanes
    return out


def tts_stages(before: dict[str, dict[str, float]], after: dict[str, dict[str, float]]) -> dict[str, Any]:
    """A text-to-speech level's stage numbers from two ``fetch`` snapshots: the codec's late chunks by cause
    (and how late, p50/p95), its chunks' wait by kind (and the decode's part of it), its decode calls' frame
    rows by part (``decode_rows``), each stage's tick p50/p99 (bucket bounds), and the talker's paced steps
    by cause."""
    out: dict[str, Any] = {}
    for name in after:
        d = diff(after[name], before.get(name, {}))
        row: dict[str, Any] = {}
        stage = "codec" if name.startswith("codec") else "talker" if name.startswith("talker") else None
        if stage is not None:
            q = hist_quantiles(d, TICK, f'stage="{stage}"')
            row["tick_s"] = {"ticks": q["count"], "p50": q["p50"], "p99": q["p99"]}
        if stage == "talker":  # steps the pacing put off (pace_* keys; 0 when it is off)
            paced = "voxstage_talker_paced_steps_total"
            row["paced"] = {by: d.get(f'{paced}{{by="{by}"}}', 0.0) for by in ("interval", "ahead")}
        if stage == "codec":
            late = {cause: hist_quantiles(d, LATE_CHUNK, f'cause="{cause}"') for cause in ("frames", "codec")}
            row["late_chunks"] = {c: {k: q[k] for k in ("count", "p50", "p95")} for c, q in late.items()}
            kinds = ("first", "short", "steady")
            for key, metric in (("chunk_wait_s", CHUNK_WAIT), ("chunk_decode_s", CHUNK_DECODE)):
                # chunk_decode_s: the wait's part after the decode's launch (the rest: queued in the codec).
                row[key] = {kind: hist_quantiles(d, metric, f'chunk="{kind}"') for kind in kinds}
            row["decode_rows"] = decode_rows(d)
        if row:
            out[name] = row
    return out
