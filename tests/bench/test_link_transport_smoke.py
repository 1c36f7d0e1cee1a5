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
