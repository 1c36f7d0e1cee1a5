"""PNG plots from load-generator JSON: TTFA percentiles and underrun rate against load.

    python -m bench.plots RESULT.json [RESULT.json ...] --out DIR

One pair of figures per load kind found (``poisson``: x = offered req/s; ``closed``: x = concurrent
streams); every input file is one series, named by its ``label`` (or file name). Levels are sorted by load,
so a search's bisection steps fall into place.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

X_LABEL = {"poisson": "offered load (requests/s, Poisson)", "closed": "concurrent streams (closed loop)"}
SUFFIX = {"poisson": "rate", "closed": "concurrency"}
PCTS = (("p50", "-"), ("p90", "--"), ("p95", "-."), ("p99", ":"))


def _series(doc: dict[str, Any], kind: str) -> list[tuple[float, dict[str, Any]]]:
    return sorted(
        ((float(lv["level"]), lv["aggregate"]) for lv in doc["levels"] if lv["kind"] == kind),
        key=lambda p: p[0],
    )


def plot_files(paths: list[Path], out_dir: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")  # files only; no display on a benchmark box
    import matplotlib.pyplot as plt

    docs = [(p, json.loads(p.read_text())) for p in paths]
    out_dir.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    for kind in ("poisson", "closed"):
        series = [(doc.get("label") or p.stem, _series(doc, kind)) for p, doc in docs]
        series = [(name, pts) for name, pts in series if pts]
        if not series:
            continue
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for color, (name, pts) in enumerate(series):
            for pct, style in PCTS:
                xs = [x for x, a in pts if a["ttfa_s"][pct] is not None]
                ys = [1e3 * a["ttfa_s"][pct] for _, a in pts if a["ttfa_s"][pct] is not None]
                ax.plot(xs, ys, style, marker="o", ms=3, color=f"C{color}", label=f"{name} {pct}")
        ax.set_xlabel(X_LABEL[kind])
        ax.set_xscale("log", base=2)  # searches step geometrically
        ax.set_ylabel("time to first audio (ms)")
        ax.set_yscale("log")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
        ax.set_title("TTFA percentiles vs load")
        path = out_dir / f"ttfa_vs_{SUFFIX[kind]}.png"
        fig.tight_layout()
        fig.savefig(path, dpi=120)
        plt.close(fig)
        written.append(path)

        fig, ax = plt.subplots(figsize=(7, 4.5))
        for color, (name, pts) in enumerate(series):
            xs = [x for x, a in pts if a["underrun_rate"] is not None]
            ys = [100 * a["underrun_rate"] for _, a in pts if a["underrun_rate"] is not None]
            ax.plot(xs, ys, "-", marker="o", ms=3, color=f"C{color}", label=name)
        ax.set_xlabel(X_LABEL[kind])
        ax.set_xscale("log", base=2)
        ax.set_ylabel("requests with ≥ 1 underrun (%)")
        ax.set_ylim(-2, 102)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
        ax.set_title("Underrun rate vs load (immediate playback, no prebuffer)")
        path = out_dir / f"underrun_vs_{SUFFIX[kind]}.png"
        fig.tight_layout()
        fig.savefig(path, dpi=120)
        plt.close(fig)
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.plots", description=__doc__)
    ap.add_argument("results", nargs="+", type=Path)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    for path in plot_files(args.results, args.out):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
