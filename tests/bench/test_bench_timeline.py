"""``bench/timeline_trace.py`` and ``bench/timeline.py`` on two hand-built Chrome traces in Kineto's format
(the categories, correlation ids and clock markers a CUDA run writes; the CPU run in
``test_capacity_smoke.py`` covers the real capture): wall-clock alignment by the markers, the tick's split,
graph vs eager kernels, and the time one process's kernels queued behind the other's."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import pytest

from bench.timeline import render_window, trace_files, write_window
from bench.timeline_trace import intersect, subtract, union

WALL0_NS = 1_796_000_000_000_000_000  # the window's start on the wall clock
WINDOW_MS = 20.0


def x(name: str, cat: str, ts_ms: float, dur_ms: float, tid: int, **args: object) -> dict:
    return {"ph": "X", "name": name, "cat": cat, "ts": ts_ms * 1e3, "dur": dur_ms * 1e3, "pid": 1, "tid": tid,
            "args": args}  # fmt: skip


def write_stage(folder: Path, role: str, pid: int, base_ns: int, events: list[dict], cpu_s: float,
                counters: dict[str, float]) -> None:  # fmt: skip
    """A trace whose clock is ``base_ns`` off the wall clock's origin; event times (ms) are wall-clock ms
    from ``WALL0_NS``, shifted into the trace's own base here, as Kineto would have recorded them."""
    shift_ms = (WALL0_NS - base_ns) / 1e6
    shifted = [dict(e, ts=e["ts"] + shift_ms * 1e3) for e in events]
    for at_ms in (0.0, WINDOW_MS):  # the capture's markers: the wall clock read just before each range
        shifted.append(x(f"voxstage.clock {WALL0_NS + int(at_ms * 1e6)}", "user_annotation", at_ms + shift_ms,
                         0.01, 7))  # fmt: skip
    doc = {"baseTimeNanoseconds": base_ns, "traceEvents": shifted}
    stem = folder / f"{role}-{pid}-w1"
    Path(f"{stem}.trace.json").write_text(json.dumps(doc))
    meta = {"role": role, "pid": pid, "engine_thread": f"{role}-engine", "start_unix_ns": WALL0_NS,
            "end_unix_ns": WALL0_NS + int(WINDOW_MS * 1e6), "process_cpu_s": cpu_s,
            "engine_thread_cpu_s": cpu_s / 2, "counters": counters}  # fmt: skip
    Path(f"{stem}.meta.json").write_text(json.dumps(meta))


@pytest.fixture
def window(tmp_path: Path) -> Path:
    # Talker tick 0-10 ms on its engine thread (tid 7): a torch op 1-3, a graph launch 3-4 (correlation 11),
    # then it blocks on the stream 4-9. Its graph's kernel was ready at 3 but ran 5-8: the codec's eager
    # kernel (launched 1.5, correlation 21) held the GPU 2-5.
    talker = [
        x("voxstage.tick talker-engine", "user_annotation", 0, 10, 7),
        x("aten::copy_", "cpu_op", 1, 2, 7),
        x("cudaGraphLaunch", "cuda_runtime", 3, 1, 7, correlation=11),
        x("cudaStreamSynchronize", "cuda_runtime", 4, 5, 7, correlation=12),
        x("void step_kernel", "kernel", 5, 3, 7, correlation=11, stream=7),
    ]
    codec = [
        x("voxstage.tick codec-engine", "user_annotation", 1, 6, 7),
        x("aten::conv1d", "cpu_op", 1.2, 0.5, 7),
        x("cudaLaunchKernel", "cuda_runtime", 1.5, 0.1, 7, correlation=21),
        x("void conv_kernel", "kernel", 2, 3, 7, correlation=21, stream=7),
    ]
    # Different trace bases (as two processes' profilers start at different times); markers align them.
    write_stage(tmp_path, "talker", 100, WALL0_NS - 5_000_000_000, talker, 0.012, {})
    write_stage(tmp_path, "codec", 200, WALL0_NS - 9_000_000_000, codec, 0.008,
                {"voxstage_audio_generated_seconds_total": 0.4})  # fmt: skip
    return tmp_path


def test_interval_helpers() -> None:
    assert union([(3, 4), (0, 1), (0.5, 2)]) == [(0, 2), (3, 4)]
    assert subtract([(0, 10)], [(1, 2), (4, 5)]) == [(0, 1), (2, 4), (5, 10)]
    assert intersect([(0, 3), (5, 8)], [(2, 6)]) == [(2, 3), (5, 6)]


def test_tick_split_and_waiting_for_the_other_process(window: Path) -> None:
    summary = render_window(window, 1, window / "tl")
    talker, codec = summary["processes"]["talker"], summary["processes"]["codec"]
    # Both traces land on the wall clock: the markers agree with the offset found (to float rounding).
    assert all(abs(r) < 1e-3 for p in (talker, codec) for r in p["clock_marker_residuals_us"])
    assert summary["overlap_ms"] == pytest.approx(WINDOW_MS)
    tick = talker["picked_tick"]
    assert tick["start_ms"] == pytest.approx(0.0, abs=1e-6)
    assert tick["tick_ms"] == pytest.approx(10)
    assert tick["torch_ops_ms"] == pytest.approx(2)
    assert tick["graph_launch_ms"] == pytest.approx(1)
    assert tick["sync_wait_ms"] == pytest.approx(5)
    assert tick["python_ms"] == pytest.approx(2)
    # Blocked 4-9 while its own GPU was idle 4-5 and 8-9; the codec's kernel ran 2-5: 1 ms of it.
    assert tick["sync_wait_other_gpu_ms"] == pytest.approx(1)
    assert tick["gpu_graph_ms"] == pytest.approx(3) and tick["gpu_eager_ms"] == 0
    # Ready at its launch (3), started at 5, the codec's kernel on the GPU until 5: all 2 ms behind it.
    assert tick["gpu_queued_ms"] == pytest.approx(2)
    assert tick["gpu_waiting_for_other_ms"] == pytest.approx(2)
    assert codec["gpu"]["eager_kernel_ms"] == pytest.approx(3) and codec["gpu"]["graph_kernel_ms"] == 0
    assert codec["gpu"]["waiting_for_other_ms"] == 0  # launched at 1.5, ran at 2: the GPU was free
    assert summary["gpu_both_busy_ms"] == 0
    # Audio per wall second from the codec's counter: 0.4 s in 20 ms = 20 audio-s/s.
    assert summary["audio"]["audio_s_per_s"] == pytest.approx(20)
    assert talker["per_audio_s"]["gpu_ms"] == pytest.approx(3 / 0.02 / 20)
    assert talker["per_audio_s"]["cpu_ms"] == pytest.approx(12 / 0.02 / 20)
    assert (window / "tl.png").stat().st_size > 10_000
    assert json.loads((window / "tl.json").read_text())["png"] == str(window / "tl.png")


def test_window_file_is_written_whole(tmp_path: Path) -> None:
    write_window(tmp_path, 1234.5, 2.0, 7, stack=True)
    assert json.loads((tmp_path / "window.json").read_text()) == {
        "id": 7, "start_unix_s": 1234.5, "duration_s": 2.0, "stack": True
    }  # fmt: skip
    assert [p.name for p in tmp_path.iterdir()] == ["window.json"]
    assert trace_files(tmp_path, 7) == []


@pytest.mark.parametrize("at_join", [False, True])
def test_the_window_opens_after_the_warm_up_or_with_the_load(tmp_path: Path, at_join: bool) -> None:
    """``--timeline-at-join`` asks for the window before the load starts (a duplex level's join burst is its
    first second); otherwise it comes once the load has started and run the warm-up."""
    from bench.capacity_phases import _load_then_window

    a = argparse.Namespace(timeline_at_join=at_join, timeline_warmup_s=0.05, timeline_window_s=2.0,
                           timeline_stack=False)  # fmt: skip
    seen: dict[str, float] = {}

    def load() -> str:
        seen["load"] = time.time()
        seen["window_then"] = float((tmp_path / "window.json").exists())
        return "done"

    value, start = _load_then_window(load, tmp_path, a)
    spec = json.loads((tmp_path / "window.json").read_text())
    assert value == "done" and spec["start_unix_s"] == start and spec["duration_s"] == 2.0
    assert seen["window_then"] == float(at_join)
    assert (start < seen["load"] + 1.0) if at_join else (start > seen["load"])
