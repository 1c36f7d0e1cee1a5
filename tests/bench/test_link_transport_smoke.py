"""``bench/link_transport.py`` as the lead runs it, at a smoke size: both modes answer every session's frame
and report CPU for both processes; the link carries them in about one batch per tick (~4 s)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_both_modes_answer_every_frame_and_report_cpu(tmp_path: Path) -> None:
    out = tmp_path / "link.json"
    cmd = [sys.executable, "-m", "bench.link_transport", "--out", str(out), "--sessions", "3"]
    cmd += ["--seconds", "0.8"]
    subprocess.run(cmd, cwd=ROOT, check=True, timeout=120, capture_output=True)
    rows = {r["mode"]: r for r in json.loads(out.read_text())["levels"]}
    assert set(rows) == {"stream", "link"}
    for row in rows.values():
        assert row["frames_answered"] == 3 * row["ticks"] and row["ticks"] == 10
        # The server's CPU is read from /proc in clock ticks (10 ms): a 0.8 s smoke level may show none.
        assert row["client_cpu_ms_per_s"] > 0 and row["server_cpu_ms_per_s"] >= 0
    assert rows["stream"]["grpc_messages_per_s"] > 0 and rows["stream"]["client_link_batches_per_s"] is None
    # Fewer batches than a call per session would send messages (3 sessions x 12.5 ticks/s): sessions share
    # batches. (About one per tick on an idle machine; a busy one turns its event loop between writes.)
    assert rows["link"]["client_link_batches_per_s"] < 3 * 12.5


def test_the_tts_shape_delivers_chunks_through_shm_per_chunk_on_calls_and_per_slab_on_the_link(
    tmp_path: Path,
) -> None:
    # 9-frame steady chunks (69 KB of f32, above the seeds' 64 KiB threshold), one a request: each request
    # ends and the next opens within the level (~4 s).
    out = tmp_path / "tts.json"
    cmd = [sys.executable, "-m", "bench.link_transport", "--shape", "tts", "--out", str(out)]
    cmd += ["--sessions", "3", "--seconds", "1.2", "--chunk-frames", "9", "--chunks", "1"]
    subprocess.run(cmd, cwd=ROOT, check=True, timeout=120, capture_output=True)
    report = json.loads(out.read_text())
    assert report["shape"] == "tts" and report["shm"]
    rows = {r["mode"]: r for r in report["levels"]}
    assert set(rows) == {"stream", "link"}
    for row in rows.values():
        assert row["chunks"] >= 3 and row["requests_finished"] >= 1 and row["request_errors"] == 0
        assert row["client_cpu_ms_per_s"] > 0 and row["server_cpu_ms_per_s"] >= 0
        assert row["shm_reads_per_s"] > 0  # the steady chunks crossed in shared memory
    stream, link = rows["stream"], rows["link"]
    assert stream["grpc_messages_per_s"] > 0 and stream["client_link_batches_per_s"] is None
    assert link["grpc_messages_per_s"] is None and link["client_link_batches_per_s"] > 0


def test_the_clients_shape_answers_every_frame_and_the_linger_shares_batches(tmp_path: Path) -> None:
    """Clients on their own clocks: with the linger off the gateway's end sends about a batch per frame;
    with a window as long as the tick all sessions' frames share one (and every frame is answered)."""
    rows = {}
    for linger in ("0", "80"):
        out = tmp_path / f"clients_{linger}.json"
        cmd = [sys.executable, "-m", "bench.link_transport", "--shape", "clients", "--out", str(out)]
        cmd += ["--sessions", "4", "--seconds", "0.8", "--linger-ms", linger]
        subprocess.run(cmd, cwd=ROOT, check=True, timeout=120, capture_output=True)
        report = json.loads(out.read_text())
        assert report["linger_ms"] == float(linger)
        (rows[linger],) = report["levels"]
    for row in rows.values():
        assert row["frames_answered"] == 4 * row["ticks"] and row["ticks"] == 10
        assert row["client_cpu_us_per_session_tick"] > 0 and 0 < row["round_trip_ms"]["p50"] < 1000
    assert rows["0"]["client_batches_per_user_frame"] > 0.5  # frames 20 ms apart: most leave alone
    assert rows["80"]["client_batches_per_user_frame"] < 0.4  # one batch per 80 ms window at most (0.25)


def test_the_receive_path_bench_reads_every_message(tmp_path: Path) -> None:
    out = tmp_path / "receive.json"
    cmd = [sys.executable, "-m", "bench.receive_path", "--out", str(out), "--sessions", "3", "--rounds", "20"]
    cmd += ["--repeats", "2"]
    subprocess.run(cmd, cwd=ROOT, check=True, timeout=120, capture_output=True)
    doc = json.loads(out.read_text())
    assert len(doc["us_per_message"]) == 2 and doc["best_us_per_message"] > 0
