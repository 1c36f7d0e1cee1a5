"""``bench/results/`` stays small: what the docs cite is committed as files, the rest of each run is packed
(``bench/pack_results.py``: logs and Prometheus snapshots in one ``raw.tar.xz`` per run, large per-phase
JSON as ``.json.xz``). Packing round-trips: every file a run wrote comes back as it was."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

from bench.pack_results import ARCHIVE, load_json, pack_run, thin_run, unpack_run

ROOT = Path(__file__).resolve().parents[2]
LIMIT_BYTES = 10 * 1024 * 1024


def test_committed_results_stay_under_ten_megabytes_and_keep_no_loose_logs() -> None:
    out = subprocess.run(
        ["git", "ls-files", "-s", "bench/results"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    names = [line.split("\t", 1)[1] for line in out.splitlines()]
    assert names, "no committed results"
    size = sum((ROOT / n).stat().st_size for n in names if (ROOT / n).is_file())
    assert size < LIMIT_BYTES, f"bench/results/ holds {size / 2**20:.1f} MiB in git; pack the runs"
    loose = [n for n in names if n.endswith((".log", ".prom", ".txt"))]
    assert not loose, f"unpacked run records (python -m bench.pack_results RUN): {loose[:5]}"
    plots = [n for n in names if "/plots/" in n]
    assert not plots, (
        f"a run's plots are redrawn from its JSON (python -m bench.plots), not kept: {plots[:3]}"
    )


def test_packing_a_run_round_trips(tmp_path: Path) -> None:
    run = tmp_path / "run"
    (run / "serve_x").mkdir(parents=True)
    files = {
        "summary.json": json.dumps({"ok": True}),
        "summary.md": "# summary\n",
        "serve_x/closed_search_x.json": json.dumps({"records": list(range(40_000))}),  # > 100 KB
        "serve_x/latency_x.json": json.dumps({"p50": 1.0}),
        "serve_x/serve_x.log": "log line\n" * 100,
        "metrics_x_talker-0.prom": "voxstage_stage_requests_total 3\n",
    }
    for name, text in files.items():
        (run / name).write_text(text)
    pack_run(run)
    kept = sorted(p.relative_to(run).as_posix() for p in run.rglob("*") if p.is_file())
    assert kept == [
        ARCHIVE,
        "serve_x/closed_search_x.json.xz",
        "serve_x/latency_x.json",
        "summary.json",
        "summary.md",
    ]
    packed = (run / ARCHIVE).read_bytes()
    again = tmp_path / "again"
    shutil.copytree(run, again)
    unpack_run(again)
    pack_run(again)
    assert (again / ARCHIVE).read_bytes() == packed  # deterministic
    unpack_run(run)
    assert {p.relative_to(run).as_posix(): p.read_text() for p in run.rglob("*") if p.is_file()} == files


def test_thinning_rounds_or_drops_only_the_per_request_records(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    aggregate = {"ttfa_ms": {"p50": 22.345678901}}
    record = {"ttfa_s": 0.0223456789, "done_s": 12.3456789, "code": "OK", "frames": 100}
    records = [record] * 400
    search = {"levels": [{"level": 128, "aggregate": aggregate, "records": records}]}
    (run / "closed_search_x.json").write_text(json.dumps(search))
    (run / "other.json").write_text(json.dumps({"levels": "not a search", "pad": "x" * 200_000}))
    pack_run(run, max_json_kb=1)
    other = (run / "other.json.xz").read_bytes()
    thin_run(run)
    got = load_json(run / "closed_search_x.json")
    assert got["levels"][0]["aggregate"] == aggregate
    want = {"ttfa_s": 0.02235, "done_s": 12.3457, "code": "OK", "frames": 100}
    assert got["levels"][0]["records"] == [want] * 400
    assert (run / "other.json.xz").read_bytes() == other
    thin_run(run, drop=True)
    dropped = load_json(run / "closed_search_x.json")["levels"][0]
    assert dropped == {"level": 128, "aggregate": aggregate, "records_dropped": 400}
    assert (run / "other.json.xz").read_bytes() == other
