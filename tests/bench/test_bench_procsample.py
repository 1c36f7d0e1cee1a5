"""``bench/procsample.py``: per-process CPU % from /proc, by group, and the stack's processes by role."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from bench.procsample import Sampler, children, cpu_seconds, format_groups, parse_groups, stack_processes

# Each prints a line once its interpreter is up: start-up is CPU work that must fall before the sampling.
BUSY = "import time\nprint(flush=True)\nt = time.time()\nwhile time.time() - t < 30: pass"
IDLE = "import time\nprint(flush=True)\ntime.sleep(30)"


def _started(code: str) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    assert proc.stdout is not None
    proc.stdout.readline()
    return proc


def test_busy_and_idle_processes_are_told_apart() -> None:
    busy, idle = _started(BUSY), _started(IDLE)
    try:
        with Sampler({"busy": [busy.pid], "idle": [idle.pid], "gone": [2**22 + 7]}, interval_s=0.25) as s:
            time.sleep(1.3)
        summary = s.summary()
    finally:
        for p in (busy, idle):
            p.kill()
            p.wait()
    procs = summary["processes"]
    assert summary["samples"] >= 4
    # One spinning thread is at most one core: 100 %, plus /proc's 10 ms tick at each end of a 0.25 s
    # interval (8 %) and the sampler thread's own scheduling delay on a loaded machine; a shared CI
    # machine (the suite beside other jobs on two cores) may give it far less, but never as little as a
    # sleeping process gets.
    busy_pct, idle_pct = procs["busy"]["cpu_pct"], procs["idle"]["cpu_pct"]
    assert busy_pct["max"] <= 115 and idle_pct["max"] < 10
    assert busy_pct["mean"] > 5 * (idle_pct["mean"] + 1)
    assert procs["gone"]["cpu_pct"]["mean"] is None  # a pid that never existed: no samples, no crash
    if summary["gpu"] is None:
        assert summary["gpu_unavailable"]  # why there is no GPU number (no NVML, no driver, no GPU)


def test_children_and_stage_roles() -> None:
    # A stand-in launcher whose children carry the stage roles in their argv, as `voxstage serve` starts them.
    code = (
        "import subprocess, sys, time\n"
        "cmd = [sys.executable, '-c', 'import time; time.sleep(30)']\n"
        "ps = [subprocess.Popen(cmd + [role]) for role in ('talker', 'codec', 'talker', 'gateway')]\n"
        "print(' '.join(str(p.pid) for p in ps), flush=True)\n"
        "time.sleep(30)\n"
    )
    launcher = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert launcher.stdout is not None
        pids = [int(p) for p in launcher.stdout.readline().split()]
        assert children(launcher.pid) == sorted(pids)
        assert stack_processes(launcher.pid) == {
            "talker": pids[0], "codec": pids[1], "talker-1": pids[2], "gateway": pids[3]
        }  # fmt: skip
        assert cpu_seconds(pids[0]) is not None
    finally:
        for pid in children(launcher.pid):
            subprocess.run(["kill", str(pid)], check=False)
        launcher.kill()
        launcher.wait()


def test_groups_round_trip() -> None:
    groups = {"talker": [11], "client": [7, 8]}
    assert parse_groups(format_groups(groups)) == groups
    with pytest.raises(ValueError, match="NAME=PID"):
        parse_groups("talker")


def test_a_short_tail_is_folded_into_the_interval_before_it() -> None:
    busy = _started(BUSY)
    try:
        with Sampler({"busy": [busy.pid]}, interval_s=0.4, gpu=False) as s:
            time.sleep(0.5)  # one full interval, then a 0.1 s tail: 10 ms ticks would make that tail +-10 %
        values = s.cpu["busy"]
    finally:
        busy.kill()
        busy.wait()
    assert len(values) == 1 and 0 <= values[0] <= 100 + 100 * 0.02 / 0.5 + 5


def test_a_stage_engine_thread_is_told_apart_from_the_event_loop() -> None:
    # The stages name their engine thread for the OS (voxstage.stage.engine_loop.name_os_thread); here it
    # spins while the main thread sleeps, as an engine busy under an idle event loop would.
    code = (
        "import threading, time\n"
        "from voxstage.stage.engine_loop import name_os_thread\n"
        "def spin():\n"
        "    name_os_thread('codec-engine')\n"
        "    print(flush=True)\n"
        "    t = time.time()\n"
        "    while time.time() - t < 30: pass\n"
        "threading.Thread(target=spin, daemon=True).start()\n"
        "time.sleep(30)\n"
    )
    proc = _started(code)
    try:
        with Sampler({"codec": [proc.pid]}, interval_s=0.25, gpu=False) as s:
            time.sleep(1.0)
        threads = s.summary()["processes"]["codec"]["cpu_pct_by_thread"]
    finally:
        proc.kill()
        proc.wait()
    assert set(threads) >= {"main", "codec-engine"}
    assert threads["codec-engine"] > 5 * (threads["main"] + 1)
