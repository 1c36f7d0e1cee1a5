"""Smoke tests of ``bench/realtime_face.py``'s own arithmetic, without a stack (the sessions it drives are
``bench.realtime_loadgen``'s, run against a real tiny stack in ``test_capacity_smoke.py``): a level's steady
window and its per-session-tick numbers, the line across levels, a process's CPU by thread from /proc, the
folding of py-spy's samples; and ``bench/realtime_face_steps.py`` (each step of a session-tick timed alone)
runs. CPU timing is not a benchmark: only the accounting and the shape are checked."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench import realtime_face_steps
from bench.duplex_levels import FRAME, TICK, SessionRecord
from bench.realtime_face import CpuSeries, cpu_between, fit, fold, level_numbers, steady_window


def record(start: float, first_audio: float, frames: int, out_every: int = 1) -> SessionRecord:
    """A session sending ``frames`` frames from ``start`` and hearing one from ``first_audio`` on."""
    rec = SessionRecord(start)
    rec.sent_at = [start + k * TICK for k in range(frames)]
    rec.audio = [(first_audio + k * TICK, FRAME) for k in range(0, frames, out_every)]
    return rec


def test_the_steady_window_leaves_out_joins_and_ends() -> None:
    recs = [record(0.0, 0.5, 100), record(0.3, 1.1, 100, out_every=2)]
    w = steady_window(recs, warm_s=1.0)
    assert w.start == pytest.approx(2.1)  # the later first audio, plus the warm-up
    assert w.end == pytest.approx(99 * TICK)  # the first session's last frame
    assert w.frames_in == sum(1 for r in recs for t in r.sent_at if w.start <= t <= w.end)
    assert w.frames_out < w.frames_in  # the second session hears every other frame
    with pytest.raises(ValueError, match="longer sessions"):
        steady_window([record(0.0, 7.0, 100)], warm_s=1.0)
    with pytest.raises(ValueError, match="nothing"):
        steady_window([SessionRecord(0.0)], warm_s=1.0)


def test_level_numbers_and_the_line_across_levels() -> None:
    w = steady_window([record(0.0, 0.2, 150) for _ in range(4)], warm_s=0.8)
    cpu = {"main": (0.8 * w.seconds * 0.09, 0.2 * w.seconds * 0.09), "event_engine": (0.01 * w.seconds, 0.0)}
    row = level_numbers(4, w, cpu, idle_pct=1.0)
    assert row["cpu_pct"] == pytest.approx(10.0)
    assert row["system_share"] == pytest.approx(0.018 / 0.1)
    assert row["us_per_session_tick"] == pytest.approx(1e6 * 0.1 * w.seconds / w.frames_in)
    assert row["us_per_session_tick_net_of_idle"] < row["us_per_session_tick"]
    # 2 % fixed plus 1.25 % a session: 1.25 % of a core is 1000 µs per 80 ms tick.
    levels = [{"sessions": n, "cpu_pct": 2.0 + 1.25 * n} for n in (2, 6, 10)]
    line = fit(levels, idle_pct=1.0)
    assert line is not None
    assert line["marginal_us_per_session_tick"] == pytest.approx(1000.0)
    assert line["fixed_cpu_pct"] == pytest.approx(2.0)
    assert line["sessions_at_one_core"] == pytest.approx(98 / 1.25)
    assert fit(levels[:1], idle_pct=1.0) is None


def test_cpu_by_thread_between_two_instants() -> None:
    burn = "import time\nwhile time.process_time() < 0.3: pass\ntime.sleep(0.4)"
    child = subprocess.Popen([sys.executable, "-c", burn])
    try:
        with CpuSeries(child.pid, interval_s=0.02) as series:
            t0 = time.monotonic()
            child.wait(timeout=30)
            t1 = time.monotonic()
    finally:
        child.kill()
    assert len(series.samples) >= 2
    cpu = cpu_between(series.samples[:-1], t0, t1)  # the last read is after the process is gone
    user, system = cpu["main"]
    assert 0.1 < user + system < 0.6  # its 0.3 s of spinning, less what start-up spent before the first read
    with pytest.raises(ValueError, match="fewer than two"):
        cpu_between(series.samples, t1 + 1, t1 + 2)


RAW = """\
<module> (voxstage/__main__.py:8);run (asyncio/runners.py:190);RealtimeConnection._read (gateway/realtime/ws.py:200);loads (json/__init__.py:346);JSONDecoder.raw_decode (json/decoder.py:353) 30
<module> (voxstage/__main__.py:8);run (asyncio/runners.py:190);RealtimeConnection._write (gateway/realtime/ws.py:260);DeltaText.base64 (gateway/realtime/events.py:250) 10
<module> (voxstage/__main__.py:8);run (asyncio/runners.py:190);_Conn._write (voxstage/link/client.py:175);_StreamRequestMixin._write (grpc/aio/_call.py:500) 40
<module> (voxstage/__main__.py:8);run (asyncio/runners.py:190);BaseEventLoop._run_once (asyncio/base_events.py:1922);EpollSelector.select (selectors.py:468) 20
"""  # noqa: E501 - py-spy's lines as it writes them


def test_py_spy_samples_fold_by_category_and_path() -> None:
    folded = fold(RAW)
    assert folded["samples"] == 100
    assert folded["pct_by_category"] == {
        "link: protobuf, gRPC": 40.0, "json": 30.0, "asyncio": 20.0, "face and session code": 10.0,
    }  # fmt: skip
    assert folded["pct_by_path"] == {
        "stage link": 40.0,
        "client events in (WebSocket -> session)": 30.0,
        "other": 20.0,
        "agent audio out (session -> WebSocket)": 10.0,
    }
    assert next(iter(folded["top_leaves_pct"])) == "_StreamRequestMixin._write (grpc/aio/_call.py:500)"


def test_each_step_of_a_session_tick_is_timed(tmp_path: Path) -> None:
    out = tmp_path / "steps.json"
    assert realtime_face_steps.main(["--out", str(out), "--calls", "20"]) == 0
    doc = json.loads(out.read_text())
    timed = {name: us for part in ("out", "in", "io") for name, us in doc[part].items()}
    assert len(timed) == 14
    optional = {name for name in timed if "orjson" in name}  # only where orjson is importable
    assert all(us is not None and us > 0 for name, us in timed.items() if name not in optional)
    assert all((timed[name] is None) == (doc["orjson"] is None) for name in optional)
