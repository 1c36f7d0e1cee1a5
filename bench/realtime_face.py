"""The gateway's WebSocket face per session (issue 27): CPU of the gateway process per session-tick on
``/v1/realtime``, and where it goes.

A session-tick is one session's 80 ms frame each way: an ``input_audio_buffer.append`` of 80 ms of 24 kHz
pcm16 in (JSON text, base64), a ``response.output_audio.delta`` out. The gateway does that work per session;
the stages do theirs per tick for all sessions at once. So this measures the gateway process alone, by its CPU
time (``/proc/<pid>/task/*/stat``, every thread), which holds on a machine shared with other jobs where wall
time does not: the stages run (a real ``voxstage serve`` stack of the duplex family, its small preset on
CPU), and the clients (the official ``openai`` client, ``bench.realtime_loadgen.realtime_session``) run in
processes of their own, so neither is counted.

Per level of N sessions, only the steady window counts: from when every session has its first agent audio
(plus ``--warm-s``) to when the first session has sent its last frame; joins and closes are left out. The
gateway's CPU over the window, less its idle rate (measured with no session for ``--idle-s`` first), divided
by the user frames sent in the window, is the level's µs per session-tick; agent frames in the window are
counted too (on CPU the tiny engines may fall behind at larger N, and then fewer frames go out than come in:
``out_per_in`` says so). Across levels, a least-squares line through (N, CPU %) gives the marginal cost of a
session (``fit``) and the fixed cost of the ticks, and from them how many sessions one gateway process carries
at 100 % of one core. CPU is also split by thread (the event loop against gRPC's own threads).

``--profile`` runs the top level once more with ``py-spy`` (a dev tool, not a dependency of voxstage:
``pip install py-spy==0.4.3``) sampling the gateway, and folds the samples by where the time goes (JSON,
base64, pydantic, WebSocket framing, asyncio, the stage link's protobuf and gRPC, audio conversion, ...) and
by path (client events in, agent audio out, the link). Its level is not a measured one (the sampler costs the
gateway CPU).

    python -m bench.realtime_face --out face.json --levels 2,6,10 --seconds 20 --threads 1 --profile
    python -m bench.realtime_face --out face.json --device cuda --model SIZE_TRUE_PRESET \\
        --levels 32,64,128 --seconds 30 --client-procs 8

Process-wide CPU moves by about ±10 % between runs on a shared machine; what each step of a session-tick
costs alone, in CPU time, is ``bench/realtime_face_steps.py``'s.
"""

from __future__ import annotations

import argparse
import collections
import json
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.duplex_levels import (
    DUPLEX,
    DUPLEX_MODEL,
    DUPLEX_VOICE,
    FRAME,
    TICK,
    Clients,
    SessionOptions,
    SessionRecord,
    level_stack,
)
from bench.procsample import thread_cpu
from bench.prom import diff, scrape
from bench.realtime_loadgen import realtime_session
from bench.stack import Stack

TICKS_PER_S = 1.0 / TICK
# The duplex family's small preset (the one that is not size-true), what a CPU run can drive.
TINY = next(p.name for p in DUPLEX.presets if p.name != DUPLEX_MODEL)


# -- the gateway's CPU, per thread, on a clock ------------------------------------------------------------


class CpuSeries:
    """``thread_cpu`` of one process every ``interval_s`` on a thread, with the time of each read, so the CPU
    between any two instants of the run can be read off afterwards (``between``)."""

    def __init__(self, pid: int, interval_s: float = 0.1) -> None:
        self.pid = pid
        self.interval_s = interval_s
        self.samples: list[tuple[float, dict[str, tuple[float, float]]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cpuseries", daemon=True)

    def _read(self) -> None:
        t0 = time.monotonic()
        cpu = thread_cpu(self.pid)
        t1 = time.monotonic()
        if cpu is not None:
            self.samples.append(((t0 + t1) / 2, cpu))

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._read()

    def __enter__(self) -> CpuSeries:
        self._read()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._read()

    def between(self, t0: float, t1: float) -> dict[str, tuple[float, float]]:
        """(user, system) CPU seconds by thread name from ``t0`` to ``t1``."""
        return cpu_between(self.samples, t0, t1)


Sample = tuple[float, dict[str, tuple[float, float]]]


def cpu_between(samples: Sequence[Sample], t0: float, t1: float) -> dict[str, tuple[float, float]]:
    """The CPU between the first and last samples inside ``[t0, t1]``, scaled to the whole span (the few ms
    between a sample and the window's edge, at the same rate)."""
    inside = [s for s in samples if t0 <= s[0] <= t1]
    if len(inside) < 2:
        raise ValueError(f"fewer than two CPU samples between {t0:.2f} and {t1:.2f}")
    (ta, a), (tb, b) = inside[0], inside[-1]
    scale = (t1 - t0) / (tb - ta)
    zero = (0.0, 0.0)
    return {
        name: (scale * (u - a.get(name, zero)[0]), scale * (s - a.get(name, zero)[1]))
        for name, (u, s) in b.items()
    }


# -- a level's steady window ---------------------------------------------------------------------------


@dataclass
class Window:
    start: float
    end: float
    frames_in: int  # user frames whose send returned inside the window, over all sessions
    frames_out: float  # agent audio that arrived inside the window, in 80 ms frames

    @property
    def seconds(self) -> float:
        return self.end - self.start


def steady_window(records: Iterable[SessionRecord], warm_s: float) -> Window:
    """From every session's first agent audio (plus ``warm_s``) to the first session's last sent frame."""
    recs = list(records)
    if not recs or any(not r.audio or not r.sent_at for r in recs):
        raise ValueError("a session sent or heard nothing: no steady window")
    start = max(r.audio[0][0] for r in recs) + warm_s
    end = min(r.sent_at[-1] for r in recs)
    if end - start < 1.0:
        raise ValueError(f"the steady window is {end - start:.2f} s: run longer sessions (--seconds)")
    frames_in = sum(1 for r in recs for t in r.sent_at if start <= t <= end)
    samples_out = sum(n for r in recs for t, n in r.audio if start <= t <= end)
    return Window(start, end, frames_in, samples_out / FRAME)


def level_numbers(
    n: int, window: Window, cpu: dict[str, tuple[float, float]], idle_pct: float
) -> dict[str, Any]:
    total = sum(u + s for u, s in cpu.values())
    pct = 100.0 * total / window.seconds
    net_s = max(total - idle_pct / 100.0 * window.seconds, 0.0)
    return {
        "sessions": n,
        "window_s": window.seconds,
        "frames_in": window.frames_in,
        "frames_out": round(window.frames_out, 1),
        "out_per_in": window.frames_out / window.frames_in if window.frames_in else None,
        "cpu_pct": pct,
        "system_share": sum(s for _, s in cpu.values()) / total if total else None,
        "cpu_pct_by_thread": {
            k: 100.0 * (u + s) / window.seconds for k, (u, s) in sorted(cpu.items()) if u + s > 0
        },
        "us_per_session_tick": 1e6 * total / window.frames_in if window.frames_in else None,
        "us_per_session_tick_net_of_idle": 1e6 * net_s / window.frames_in if window.frames_in else None,
    }


def link_batches(d: dict[str, float], frames_in: int) -> dict[str, float | None]:
    """The gateway's side of its stage links over a level (``d``: its Prometheus diff): batches sent, the
    messages they carried, and batches per user frame (one batch per tick carries every session's frames
    when they come together; one per frame when each session's come on its own)."""
    labels = '{end="downstream"}'
    batches = d.get(f"voxstage_link_batches_total{labels}", 0.0)
    items = d.get(f"voxstage_link_items_total{labels}", 0.0)
    return {
        "batches": batches,
        "items": items,
        "items_per_batch": items / batches if batches else None,
        "batches_per_user_frame": batches / frames_in if frames_in else None,
    }


def fit(levels: Sequence[dict[str, Any]], idle_pct: float) -> dict[str, Any] | None:
    """Least squares of CPU % on sessions: the marginal µs per session-tick, the fixed %, and the sessions
    one process carries at 100 % of a core on that line."""
    points = [(row["sessions"], row["cpu_pct"]) for row in levels]
    if len({n for n, _ in points}) < 2:
        return None
    mx = sum(n for n, _ in points) / len(points)
    my = sum(c for _, c in points) / len(points)
    slope = sum((n - mx) * (c - my) for n, c in points) / sum((n - mx) ** 2 for n, _ in points)
    intercept = my - slope * mx
    per_tick_us = slope / 100.0 / TICKS_PER_S * 1e6
    return {
        "marginal_us_per_session_tick": per_tick_us,
        "marginal_cpu_pct_per_session": slope,
        "fixed_cpu_pct": intercept,
        "idle_cpu_pct": idle_pct,
        "sessions_at_one_core": (100.0 - intercept) / slope if slope > 0 else None,
    }


# -- the profile ---------------------------------------------------------------------------------------

# Where a sample's time goes: the first rule, from the innermost frame out, whose pattern is in the frame's
# file. A C call (json's encoder, binascii) shows as the Python frame that made it.
CATEGORIES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("json", ("json/",)),
    ("base64", ("base64.py", "voxstage/base64_text.py")),
    ("pydantic validation", ("pydantic/", "pydantic_core/")),
    ("websocket framing", ("websockets/", "uvicorn/protocols/websockets/")),
    ("starlette / ASGI", ("starlette/", "fastapi/")),
    ("audio conversion (numpy, resampling)", ("voxstage/duplex_audio.py", "voxstage/audio.py", "numpy/",
                                              "voxstage/g711.py")),
    ("link: protobuf, gRPC", ("google/protobuf/", "voxstage/link/", "grpc/", "voxstage/transport/",
                              "gateway/duplex/upstream.py", "gateway/upstream.py")),
    ("metrics", ("prometheus_client/",)),
    ("face and session code", ("gateway/realtime/", "gateway/duplex/")),
    ("asyncio", ("asyncio/", "selectors.py")),
    ("other threads", ("threading.py",)),
)  # fmt: skip
# The path a sample is on: the first rule, from the outermost frame in.
PATHS: tuple[tuple[str, str], ...] = (
    ("client events in (WebSocket -> session)", "RealtimeConnection._read"),
    ("agent audio out (session -> WebSocket)", "RealtimeConnection._write"),
    ("session: agent PCM from the codec", "DuplexSession._run"),
    ("session: user frames to the codec", "DuplexSession._send"),
    ("WebSocket protocol (uvicorn)", "websockets_sansio_impl.py"),
    ("stage link", "voxstage/link/"),
    ("other threads", "Thread.run"),
)


def frame_file(frame: str) -> str:
    """``func (path/file.py:12)`` -> ``path/file.py``."""
    inner = frame[frame.rfind("(") + 1 : frame.rfind(")")]
    return inner.rsplit(":", 1)[0]


def _categories(path: str) -> list[str]:
    return [name for name, patterns in CATEGORIES if any(p in path for p in patterns)][:1]


def fold(raw: str) -> dict[str, Any]:
    """py-spy's raw output (``frame;frame;... count`` per line, outermost first), by category and by path."""
    by_category: collections.Counter[str] = collections.Counter()
    by_path: collections.Counter[str] = collections.Counter()
    leaves: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.splitlines():
        stack, _, count = line.rstrip().rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = stack.split(";")
        total += n
        leaves[frames[-1]] += n
        category = next((name for f in reversed(frames) for name in _categories(frame_file(f))), "other")
        by_category[category] += n
        path = next((name for name, pat in PATHS if any(pat in f for f in frames)), "other")
        by_path[path] += n

    def shares(c: collections.Counter[str]) -> dict[str, float]:
        return {k: round(100.0 * v / total, 1) for k, v in c.most_common()} if total else {}

    return {
        "samples": total,
        "pct_by_category": shares(by_category),
        "pct_by_path": shares(by_path),
        "top_leaves_pct": dict(list(shares(leaves).items())[:25]),
    }


def py_spy() -> str:
    """py-spy on PATH, beside this interpreter, or in the ``bin`` of a ``pip install --target`` folder on
    ``sys.path`` (the GPU box's ``/tmp/vx-site``, bench/README.md)."""
    places = [Path(sys.executable).with_name("py-spy"), *(Path(p) / "bin" / "py-spy" for p in sys.path if p)]
    found = shutil.which("py-spy") or next((str(p) for p in places if p.is_file()), None)
    if found is None:
        raise SystemExit("--profile needs py-spy (a dev tool): pip install py-spy==0.4.3")
    return found


# -- the run -------------------------------------------------------------------------------------------


@dataclass
class Run:
    args: argparse.Namespace
    stack: Stack
    clients: Clients
    gateway_pid: int
    result: dict[str, Any] = field(default_factory=dict)

    def sessions(self, n: int) -> list[SessionRecord]:
        a = self.args
        opts = SessionOptions(voice=a.voice, model=a.model)
        parts = self.clients.run(realtime_session, self.stack.http, n, a.seconds, a.join_spread_s, opts)
        return [rec for part in parts for rec in part.records.values()]

    def idle(self) -> float:
        with CpuSeries(self.gateway_pid) as series:
            t0 = time.monotonic()
            time.sleep(self.args.idle_s)
            t1 = time.monotonic()
        return 100.0 * sum(u + s for u, s in series.between(t0, t1).values()) / (t1 - t0)

    def level(self, n: int, idle_pct: float, folder: Path) -> dict[str, Any]:
        before = scrape(self.stack, f"before_{n}", folder).get("gateway", {})
        procs = self.stack.processes()
        with (
            CpuSeries(self.gateway_pid) as series,
            CpuSeries(procs["codec"]) as codec,
            CpuSeries(procs["talker"]) as talker,
        ):
            records = self.sessions(n)
        after = scrape(self.stack, f"after_{n}", folder).get("gateway", {})
        errors = collections.Counter(code for r in records for code, _ in r.errors)
        window = steady_window(records, self.args.warm_s)
        row = level_numbers(n, window, series.between(window.start, window.end), idle_pct)
        # The stages' threads too: each one's event loop ("main") carries the per-session messages of its
        # links, its engine thread the model.
        ticks = max(window.frames_in, 1)
        for name, stage in (("codec", codec), ("talker", talker)):
            used = stage.between(window.start, window.end)
            row[f"{name}_us_per_session_tick_by_thread"] = {
                k: 1e6 * (u + s) / ticks for k, (u, s) in sorted(used.items()) if u + s > 0
            }
        row["link_from_gateway"] = link_batches(diff(after, before), sum(r.frames_sent for r in records))
        row["errors_by_code"] = dict(errors)
        return row

    def profile(self, n: int, folder: Path) -> dict[str, Any]:
        """The top level again with py-spy on the gateway over its middle; the samples folded."""
        raw = folder / f"pyspy_{n}.txt"
        duration = max(int(self.args.seconds - 6), 2)
        cmd = [py_spy(), "record", "--pid", str(self.gateway_pid), "--duration", str(duration)]
        cmd += ["--rate", str(self.args.profile_rate), "--format", "raw", "--output", str(raw), "--gil"]

        def attach() -> subprocess.CompletedProcess[bytes]:
            time.sleep(4.0)  # past the joins
            return subprocess.run(cmd, capture_output=True, timeout=duration + 60)

        box: list[subprocess.CompletedProcess[bytes]] = []
        spy = threading.Thread(target=lambda: box.append(attach()), daemon=True)
        spy.start()
        self.sessions(n)
        spy.join()
        if not box or box[0].returncode != 0 or not raw.exists():
            err = box[0].stderr.decode(errors="replace")[-500:] if box else "py-spy did not finish"
            return {"sessions": n, "error": err}
        return {
            "sessions": n,
            "rate_hz": self.args.profile_rate,
            "seconds": duration,
            **fold(raw.read_text()),
        }


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--model", default=TINY, help="a preset or checkpoint of the duplex family")
    p.add_argument("--device", default="cpu")
    p.add_argument("--levels", default="2,8", help="sessions per level")
    p.add_argument("--seconds", type=float, default=20.0, help="user audio per session (s)")
    p.add_argument("--warm-s", type=float, default=1.0, help="after the last first-audio, before the window")
    p.add_argument("--idle-s", type=float, default=3.0, help="the gateway's idle CPU, measured first")
    p.add_argument("--join-spread-s", type=float, default=None)
    p.add_argument("--client-procs", type=int, default=2, help="client processes (never the gateway's)")
    p.add_argument("--voice", default=DUPLEX_VOICE)
    p.add_argument("--threads", type=int, default=None, help="torch threads per stage (CPU runs: 1)")
    p.add_argument("--set", action="append", default=[], help="extra deploy overrides")
    p.add_argument("--settle", type=float, default=2.0, help="pause between levels (s)")
    p.add_argument("--profile", action="store_true", help="then the top level once more under py-spy")
    p.add_argument("--profile-rate", type=int, default=200, help="py-spy samples per second")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    levels = [int(x) for x in args.levels.split(",")]
    if args.profile:
        py_spy()
    folder = args.out.with_suffix("")
    folder.mkdir(parents=True, exist_ok=True)
    stack = level_stack(args, folder)
    if not stack.start():
        raise SystemExit(f"stack did not start:\n{stack.tail()}")
    result: dict[str, Any] = {"tool": "bench.realtime_face", "model": args.model, "device": args.device}
    result |= {"seconds": args.seconds, "client_procs": args.client_procs, "command": stack.command()}
    clients = Clients(args.client_procs, preload="bench.realtime_loadgen")
    try:
        run = Run(args, stack, clients, stack.processes()["gateway"])
        idle_pct = run.idle()
        result |= {"idle_cpu_pct": idle_pct, "levels": []}
        for k, n in enumerate(levels):
            if k:
                time.sleep(args.settle)
            row = run.level(n, idle_pct, folder)
            result["levels"].append(row)
            print(json.dumps(row), flush=True)
            result["fit"] = fit(result["levels"], idle_pct)
            args.out.write_text(json.dumps(result, indent=1) + "\n")
        if args.profile:
            time.sleep(args.settle)
            result["profile"] = run.profile(max(levels), folder)
            print(json.dumps(result["profile"]), flush=True)
    finally:
        clients.close()
        stack.stop()
    print(json.dumps({"fit": result.get("fit")}), flush=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
