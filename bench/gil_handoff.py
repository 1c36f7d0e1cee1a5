"""How long a thread waits to get the GIL back beside a busy Python thread, per switch interval (issues 27,
28): whether a stage's engine thread loses time to its event loop that a shorter ``sys.setswitchinterval``
would give back (docs/benchmarks.md, 2026-12-03 fifth session: not on the CPU box's numbers).

An "engine" thread releases the GIL for ``--release-ms`` (a sleep, as a device synchronize or a queue wait
releases it) ``--rounds`` times, while a "loop" thread runs pure Python without pause, as an event loop
does under load. The engine's extra wait per release (its wall time less the release) is the hand-off the
switch interval bounds. Each arm runs in a fresh interpreter, so one arm's interval cannot leak into
another's.

The tick arms are closer to a served engine: a tick of 120 small torch ops (each releases the GIL) beside a
loop thread that is busy for ``--duty`` of each ``--bursts-ms`` period, as an event loop handling a batch.

    python -m bench.gil_handoff --out gil.json --intervals-ms 5,1,0.5
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from bench.playback import percentile


def arm(interval_s: float, release_s: float, rounds: int) -> dict[str, Any]:
    """One arm, in this interpreter: the engine's extra wait per release, in ms."""
    sys.setswitchinterval(interval_s)
    stop = threading.Event()

    def loop() -> None:
        x = 0
        while not stop.is_set():
            for i in range(1000):
                x += i

    waits: list[float] = []
    busy = threading.Thread(target=loop, daemon=True)
    busy.start()
    time.sleep(0.05)  # the loop thread holds the GIL from here on
    for _ in range(rounds):
        t0 = time.perf_counter()
        time.sleep(release_s)
        waits.append(1e3 * (time.perf_counter() - t0 - release_s))
    stop.set()
    busy.join()
    return {
        "interval_ms": 1e3 * interval_s,
        "extra_wait_ms": {q: percentile(waits, p) for q, p in (("p50", 50), ("p95", 95), ("p99", 99))}
        | {"max": max(waits), "mean": sum(waits) / len(waits)},
    }


def tick_arm(interval_s: float, burst_s: float, duty: float, ticks: int) -> dict[str, Any]:
    """An engine tick of 120 small torch ops on the CPU (each releases the GIL, as each op's launch does)
    beside a loop thread that runs Python for ``duty`` of every ``burst_s`` and waits the rest, as an event
    loop under load does; the tick's wall time in ms, alone and beside the loop."""
    import torch

    sys.setswitchinterval(interval_s)
    torch.set_num_threads(1)
    a = torch.randn(64, 64)

    def tick() -> float:
        t0 = time.perf_counter()
        y = a
        for _ in range(60):
            y = torch.tanh(y @ a)
        return 1e3 * (time.perf_counter() - t0)

    stop = threading.Event()

    def loop() -> None:
        x = 0
        while not stop.is_set():
            t0 = time.perf_counter()
            while time.perf_counter() - t0 < burst_s * duty:
                for i in range(200):
                    x += i
            time.sleep(burst_s * (1 - duty))

    alone = [tick() for _ in range(ticks)]
    busy = threading.Thread(target=loop, daemon=True)
    busy.start()
    time.sleep(0.05)
    beside = [tick() for _ in range(ticks)]
    stop.set()
    busy.join()

    def summary(values: list[float]) -> dict[str, float | None]:
        return {"p50": percentile(values, 50), "p90": percentile(values, 90), "max": max(values)}

    return {"interval_ms": 1e3 * interval_s, "burst_ms": 1e3 * burst_s, "duty": duty,
            "tick_alone_ms": summary(alone), "tick_beside_loop_ms": summary(beside)}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--intervals-ms", default="5,1,0.5", help="switch intervals, one arm each (5: default)")
    ap.add_argument("--release-ms", type=float, default=1.0)
    ap.add_argument("--rounds", type=int, default=400)
    ap.add_argument("--bursts-ms", default="2,10,20", help="tick arms: the loop's burst + wait period")
    ap.add_argument("--duty", type=float, default=0.5, help="tick arms: the loop's busy share of a period")
    ap.add_argument("--ticks", type=int, default=60)
    ap.add_argument("--arm-ms", type=float, default=None, help=argparse.SUPPRESS)  # one arm, in a child
    ap.add_argument("--burst-ms", type=float, default=None, help=argparse.SUPPRESS)  # a tick arm, in a child
    a = ap.parse_args()
    if a.arm_ms is not None:
        if a.burst_ms is None:
            print(json.dumps(arm(a.arm_ms / 1e3, a.release_ms / 1e3, a.rounds)))
        else:
            print(json.dumps(tick_arm(a.arm_ms / 1e3, a.burst_ms / 1e3, a.duty, a.ticks)))
        return

    def child(*extra: str) -> dict[str, Any]:
        cmd = [sys.executable, "-m", "bench.gil_handoff", "--out", str(a.out), *extra]
        cmd += ["--release-ms", str(a.release_ms), "--rounds", str(a.rounds), "--duty", str(a.duty)]
        out = json.loads(subprocess.run([*cmd, "--ticks", str(a.ticks)], check=True, capture_output=True,
                                        text=True).stdout)  # fmt: skip
        print(json.dumps(out))
        return out

    intervals = a.intervals_ms.split(",")
    arms = [child("--arm-ms", ms) for ms in intervals]
    ticks = [child("--arm-ms", ms, "--burst-ms", b) for b in a.bursts_ms.split(",") for ms in intervals]
    result = {"tool": "bench.gil_handoff", "release_ms": a.release_ms, "rounds": a.rounds, "arms": arms,
              "tick_arms": ticks}  # fmt: skip
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
