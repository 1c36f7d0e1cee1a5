"""What the duplex load generators share (issues 12 and 27): the user audio, one session's record and its
playback as heard, the load levels against a stack, and each level's row.

``bench/duplex_loadgen.py`` drives sessions through gRPC ``Converse``; ``bench/realtime_loadgen.py`` through
the ``/v1/realtime`` WebSocket with the official ``openai`` client. A session function of either kind takes
``(target, seconds, seed, options)`` and returns a ``SessionRecord``; everything else is here.

Per level: N sessions join over ``--join-spread-s``, each sending one 80 ms frame of 24 kHz pcm16 every
80 ms on an absolute schedule for ``--seconds``. The row holds, from the client: agent audio frames, late
frames and stalls **as heard** (a player per session starts at its first agent audio with no prebuffer and
plays 80 ms per frame; ``bench.playback``), the worst stall, first agent audio p50/p95/max, errors by code,
the client's own send lag and event-loop lag; from the stack's Prometheus text diffed over the level
(``bench.prom``): tick p50/p95/p99 per stage, the codec's late frames and input underflows, the gateway's
response latency, dropped input; and, sampled every second (``bench.procsample``), each process's CPU and
the GPU's busy share. Times are ``time.monotonic()`` (CLOCK_MONOTONIC: one clock for every process of the
host, so records from several client processes compare).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import collections
import concurrent.futures
import functools
import importlib
import json
import multiprocessing
import os
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from bench.levels import LagProbe
from bench.playback import percentile, simulate_playback, stalls_in_client_stalls
from bench.procsample import Sampler
from bench.prom import counter, diff, hist_quantiles, loop_lag, scrape
from bench.stack import Stack, StackSpec
from voxstage import families, heap

RATE = 24000
FRAME = 1920  # samples per 80 ms
TICK = 0.08
LATE_TOLERANCE_S = 1e-3  # a frame within 1 ms of its play time is on time (clock and scheduling noise)
PREPARE_S = 0.1  # a client process's time to make one session's user audio before a level starts (generous)
T = TypeVar("T")
# The duplex family's (voxstage.families): its seed deploy file, size-true preset and benchmark voice.
DUPLEX = next(f for f in families.families() if f.duplex)
DEPLOY = Path(__file__).resolve().parents[1] / DUPLEX.deploy_file
DUPLEX_MODEL = next(p.name for p in DUPLEX.presets if p.random_init)
DUPLEX_VOICE = DUPLEX.bench.voice if DUPLEX.bench is not None else ""


@dataclass
class SessionOptions:
    voice: str = DUPLEX_VOICE
    persona: str = "You enjoy having a good conversation."
    model: str = ""  # the served model name, for the WebSocket face's ?model=
    grace_s: float = 0.5  # after the last user frame, how long the session waits for the last answers


STALLS_KEPT = 16  # per session in the level's JSON


@dataclass
class SessionRecord:
    started: float
    opened_at: float | None = None
    audio: list[tuple[float, int]] = field(default_factory=list)  # (arrival, samples)
    transcript_chars: int = 0
    errors: list[tuple[str, str]] = field(default_factory=list)  # (code, message)
    frames_sent: int = 0
    send_lag: list[float] = field(default_factory=list)  # per frame: actual send - scheduled (s)
    sent_at: list[float] = field(default_factory=list)  # per frame: when its send returned (monotonic)

    def error(self, code: str, message: str) -> None:
        self.errors.append((code, message))

    def audio_between(self, t0: float, t1: float) -> float:
        """Seconds of agent audio that arrived in ``[t0, t1)`` (monotonic)."""
        return sum(n for t, n in self.audio if t0 <= t < t1) / RATE

    def summary(self, loop_stalls: Sequence[tuple[float, float]] = ()) -> dict[str, Any]:
        """``loop_stalls``: when this session's client process's loop was blocked (``LagProbe.events``)."""
        play = simulate_playback(self.audio, RATE, tolerance_s=LATE_TOLERANCE_S)
        played = sum(n for _, n in self.audio)
        out: dict[str, Any] = {
            "frames": played // FRAME,
            "late": play.stalls,
            "late_in_client_stalls": stalls_in_client_stalls(play.stall_events, loop_stalls),
            "stall_total_s": play.stall_total_s,
            "stall_max_s": play.stall_max_s,
            # When (s after the session started) and how long its first stalls were: joins or steady state.
            "stalls_at_s": [
                [round(t - self.started, 3), round(d, 3)] for t, d in play.stall_events[:STALLS_KEPT]
            ],
            "first_audio_s": self.audio[0][0] - self.started if self.audio else None,
            # Connect to session.created: the client's and the face's part of first audio, not the stages'.
            "opened_s": None if self.opened_at is None else self.opened_at - self.started,
            "transcript_chars": self.transcript_chars,
            "frames_sent": self.frames_sent,
            "send_lag_max_s": max(self.send_lag, default=None),
            "errors": [f"{code}: {message}" for code, message in self.errors],
        }
        return out


def user_audio(seconds: float, seed: int) -> bytes:
    """A voiced-ish signal (a wandering tone plus noise) at -20 dBFS, pcm16."""
    t = np.arange(int(seconds * RATE)) / RATE
    f0 = 140 + 30 * np.sin(2 * np.pi * 0.3 * t + seed)
    x = 0.1 * np.sin(2 * np.pi * np.cumsum(f0) / RATE) + 0.01 * np.random.default_rng(seed).standard_normal(
        t.size
    )
    return (np.clip(x, -1, 1) * 32767).astype("<i2").tobytes()


@functools.lru_cache(maxsize=256)
def user_frames(seconds: float, seed: int) -> tuple[bytes, ...]:
    """``user_audio`` cut into 80 ms frames, as a microphone hands them over. Kept: a client process makes
    its sessions' audio before a level's clock starts (``_run_part``), not on its event loop while other
    sessions play (tens of ms each, which stalled every session of a process on the H200)."""
    audio = user_audio(seconds, seed)
    return tuple(audio[2 * FRAME * k : 2 * FRAME * (k + 1)] for k in range(len(audio) // (2 * FRAME)))


@functools.lru_cache(maxsize=256)
def user_frames_b64(seconds: float, seed: int) -> tuple[str, ...]:
    """``user_frames`` as base64 text (the Realtime API's ``input_audio_buffer.append``), kept likewise."""
    return tuple(base64.b64encode(f).decode("ascii") for f in user_frames(seconds, seed))


async def paced(frames: Sequence[T], rec: SessionRecord, send: Callable[[T], Awaitable[None]]) -> None:
    """One frame every 80 ms on an absolute schedule, as a microphone delivers it; each frame's lateness
    against its schedule is kept (if it grows, the client fell behind, not the server)."""
    t0 = time.monotonic()
    for k, chunk in enumerate(frames):
        due = t0 + k * TICK
        delay = due - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        rec.send_lag.append(time.monotonic() - due)
        await send(chunk)
        rec.sent_at.append(time.monotonic())
        rec.frames_sent += 1


SessionFn = Callable[[str, float, int, SessionOptions], Awaitable[SessionRecord]]


def join_offset(i: int, n: int, spread_s: float | None) -> float:
    """Session i's join time within its level: spread evenly over ``spread_s`` (None: over min(1, 4/n) s,
    the issue-12 runs' spacing)."""
    spread = min(1.0, 4.0 / max(n, 1)) if spread_s is None else spread_s
    return i * spread / max(n, 1)


@dataclass
class Part:
    """One client process's share of a level."""

    records: dict[int, SessionRecord]
    loop_lag_ms: dict[str, float | None]
    pid: int
    loop_stalls: list[tuple[float, float]] = field(default_factory=list)  # LagProbe.events
    started_late_s: float = 0.0  # how far past the level's start making the sessions' audio ran


async def _run_part(
    fn: SessionFn, target: str, indices: list[int], n: int, t_start: float, seconds: float,
    spread_s: float | None, opts: SessionOptions,
) -> Part:  # fmt: skip
    async def one(i: int) -> tuple[int, SessionRecord]:
        await asyncio.sleep(max(0.0, t_start + join_offset(i, n, spread_s) - time.monotonic()))
        return i, await fn(target, seconds, session_seed(i), opts)

    for i in indices:
        user_frames_b64(seconds, session_seed(i))  # before the clock (see user_frames); the pcm too
    warm = getattr(sys.modules[fn.__module__], "warm_client", None)
    if warm is not None:
        await warm(target)  # the session module's client library, warmed before the clock too
    # A full garbage-collector pass over this process's ~110k start-up objects stopped its loop for 60-90 ms
    # on the H200 box, in the first level only: every session of the process heard it at once (voxstage.heap).
    heap.freeze()
    late_by = max(0.0, time.monotonic() - t_start)
    with LagProbe() as lag:
        done = await asyncio.gather(*(one(i) for i in indices))
    return Part(dict(done), lag.summary(), os.getpid(), lag.events, late_by)


def session_seed(i: int) -> int:
    return 1000 + i


def run_part(
    fn: SessionFn, target: str, indices: list[int], n: int, t_start: float, seconds: float,
    spread_s: float | None, opts: SessionOptions,
) -> Part:  # fmt: skip
    """Entry point of a client process (and of the in-process run)."""
    return asyncio.run(_run_part(fn, target, indices, n, t_start, seconds, spread_s, opts))


def _warm_worker(delay_s: float, module: str | None) -> int:
    if module is not None:
        importlib.import_module(module)  # the session function's imports, before any level's clock runs
    time.sleep(delay_s)
    return os.getpid()


class Clients:
    """Where the sessions run: this process, or ``procs`` spawned client processes (one event loop cannot
    send and parse 128 sessions' events at 12.5 Hz each without falling behind; ``send_lag`` and
    ``loop_lag`` say whether it did). ``preload``: the session function's module, imported by every
    client process before any level's clock runs."""

    def __init__(self, procs: int, preload: str | None = None) -> None:
        self.procs = max(1, procs)
        self.pool: concurrent.futures.ProcessPoolExecutor | None = None
        self.pids = [os.getpid()]
        if self.procs > 1:
            ctx = multiprocessing.get_context("spawn")
            self.pool = concurrent.futures.ProcessPoolExecutor(self.procs, mp_context=ctx)
            # Tasks that overlap in time start every worker now, so their pids are known to the sampler.
            warm = [self.pool.submit(_warm_worker, 0.5, preload) for _ in range(self.procs)]
            self.pids += sorted({f.result() for f in warm})

    def run(
        self, fn: SessionFn, target: str, n: int, seconds: float, spread_s: float | None, opts: SessionOptions
    ) -> list[Part]:
        if self.pool is None:
            return [run_part(fn, target, list(range(n)), n, time.monotonic(), seconds, spread_s, opts)]
        # Every worker's loop is running by then, and has made its sessions' audio (user_frames).
        t_start = time.monotonic() + 0.5 + PREPARE_S * -(-n // self.procs)
        parts = [
            self.pool.submit(
                run_part, fn, target, list(range(w, n, self.procs)), n, t_start, seconds, spread_s, opts
            )  # fmt: skip
            for w in range(self.procs)
        ]
        return [p.result() for p in parts]

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown()


def _stats(values: list[float]) -> dict[str, float | None]:
    return {"p50": percentile(values, 50), "p95": percentile(values, 95), "max": max(values, default=None)}


def level_row(
    n: int, wall: float, parts: list[Part], d: dict[str, dict[str, float]], processes: dict[str, Any] | None
) -> dict[str, Any]:
    """One level's numbers (see the module docstring); ``d`` is each process's Prometheus diff."""
    records = [rec for part in parts for rec in part.records.values()]
    # Each session's index is its place in the join order (join_offset) and says its client process.
    by_part = [
        [{"index": i, **rec.summary(part.loop_stalls)} for i, rec in part.records.items()] for part in parts
    ]
    sessions = [summary for part in by_part for summary in part]
    frames = sum(s["frames"] for s in sessions)
    late = sum(s["late"] for s in sessions)
    firsts = [s["first_audio_s"] for s in sessions if s["first_audio_s"] is not None]
    codes = collections.Counter(code for r in records for code, _ in r.errors)
    lags = [1e3 * x for r in records for x in r.send_lag]
    empty: dict[str, float] = {}
    gateway, codec, talker = d.get("gateway", empty), d.get("codec", empty), d.get("talker", empty)
    return {
        "sessions": n,
        "wall_s": wall,
        "errors": sum(codes.values()),
        "errors_by_code": dict(codes),
        "sessions_with_errors": sum(1 for r in records if r.errors),
        "sessions_without_audio": sum(1 for r in records if not r.audio),
        "agent_frames": frames,
        "client_late_frames": late,
        # Of those, the ones the load client's own blocked event loop explains (bench.playback).
        "client_late_frames_in_client_stalls": sum(s["late_in_client_stalls"] for s in sessions),
        "client_late_rate": late / frames if frames else None,
        "stalled_sessions": sum(1 for s in sessions if s["late"]),
        "stall_max_s": max((s["stall_max_s"] for s in sessions), default=None),
        "stall_total_s": sum(s["stall_total_s"] for s in sessions),
        "first_audio_s": _stats(firsts),
        "first_audio_s_max": max(firsts, default=None),
        "opened_s": _stats([s["opened_s"] for s in sessions if s["opened_s"] is not None]),
        "talker_tick": hist_quantiles(talker, "voxstage_stage_tick_seconds", 'stage="talker"'),
        "codec_tick": hist_quantiles(codec, "voxstage_stage_tick_seconds", 'stage="codec"'),
        "codec_late_frames": counter(codec, "voxstage_duplex_late_frames"),
        "codec_underflow_ticks": counter(codec, "voxstage_duplex_input_underflow_ticks"),
        "codec_jitter_dropped_s": counter(codec, "voxstage_duplex_jitter_dropped_seconds"),
        "talker_dropped_user_frames": counter(talker, "voxstage_duplex_dropped_user_frames"),
        "gateway_dropped_input_s": counter(gateway, "voxstage_duplex_dropped_input_seconds"),
        "gateway_refused_sessions": counter(gateway, "voxstage_duplex_refused_sessions"),
        "response_latency": hist_quantiles(gateway, "voxstage_duplex_response_latency_seconds"),
        # Where a join's first audio goes, server side: the stages' admission, then to the first agent audio
        # (of which the talker's prefill wait is a part).
        "join_open": hist_quantiles(gateway, "voxstage_duplex_join_seconds", 'phase="open"'),
        "join_first_audio": hist_quantiles(gateway, "voxstage_duplex_join_seconds", 'phase="first_audio"'),
        "talker_prefill_wait": hist_quantiles(talker, "voxstage_duplex_prefill_wait_seconds"),
        # Each process's event loop: a block of it delays all its sessions' messages (voxstage.loop_lag).
        "loop_lag": {"gateway": loop_lag(gateway), "codec": loop_lag(codec), "talker": loop_lag(talker)},
        "client": {
            "processes": len(parts),
            "send_lag_ms": {
                "p50": percentile(lags, 50),
                "p99": percentile(lags, 99),
                "max": max(lags, default=None),
            },
            "loop_lag_ms": [p.loop_lag_ms for p in parts],
            "started_late_s": max((p.started_late_s for p in parts), default=0.0),
            # Per client process: sessions that heard a late frame, of its sessions. A server-side delay
            # hits sessions whatever process reads them; a stall of one client process hits its own alone.
            "stalled_sessions_by_process": [
                [sum(1 for x in part if x["late"]), len(part)] for part in by_part
            ],
        },
        "processes": processes,
        "per_session": sessions,
    }


def add_level_options(parser: argparse.ArgumentParser, *, default_levels: str) -> None:
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--model", default=DUPLEX_MODEL, help="preset or checkpoint (the duplex family's)")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--levels", default=default_levels, help="sessions per level, e.g. 32,64")
    parser.add_argument("--seconds", type=float, default=60.0, help="user audio per session (s)")
    parser.add_argument("--voice", default=DUPLEX_VOICE)
    parser.add_argument("--persona", default="You enjoy having a good conversation.")
    parser.add_argument(
        "--join-spread-s", type=float, default=None,
        help="sessions of a level join evenly over this many seconds (default: min(1, 4/N))",
    )  # fmt: skip
    parser.add_argument(
        "--client-procs", type=int, default=1, help="client processes the sessions are spread over"
    )
    parser.add_argument("--settle", type=float, default=3.0, help="pause between levels (s)")
    parser.add_argument("--set", action="append", default=[], help="extra deploy overrides")
    parser.add_argument("--threads", type=int, default=None, help="torch threads per stage (CPU runs)")


def level_stack(args: argparse.Namespace, folder: Path, env: dict[str, str] | None = None) -> Stack:
    """The duplex family's stack for these levels: as many sessions and slots as the top level."""
    top = max(int(x) for x in args.levels.split(","))
    sets = (f"duplex_session.max_sessions={top}", *args.set)
    spec = StackSpec(
        args.model, device=args.device, frames=None, slots=top, deploy=DEPLOY, extra_sets=sets,
        threads=args.threads,
    )  # fmt: skip
    return Stack(spec, folder / "stack.log", env=env)


def measure_level(
    stack: Stack, clients: Clients, fn: SessionFn, target: str, n: int, args: argparse.Namespace,
    folder: Path,
) -> dict[str, Any]:  # fmt: skip
    """One level against a running stack: scrape, sample, run the sessions, scrape again, the row."""
    opts = SessionOptions(voice=args.voice, persona=args.persona, model=args.model)
    before = scrape(stack, f"before_{n}", folder)
    groups = {**stack.process_groups(), "client": clients.pids}
    t0 = time.monotonic()
    with Sampler(groups) as sampler:
        parts = clients.run(fn, target, n, args.seconds, args.join_spread_s, opts)
    wall = time.monotonic() - t0
    after = scrape(stack, f"after_{n}", folder)
    d = {p: diff(after[p], before.get(p, {})) for p in after}
    return level_row(n, wall, parts, d, sampler.summary())


def run_levels(args: argparse.Namespace, tool: str, fn: SessionFn, face: str) -> None:
    """Start the stack, run every level of ``--levels`` through ``face`` (``grpc`` / ``http``), write JSON
    after each level (a run cut short keeps what it finished)."""
    levels = [int(x) for x in args.levels.split(",")]
    folder = args.out.with_suffix("")
    folder.mkdir(parents=True, exist_ok=True)
    stack = level_stack(args, folder)
    result: dict[str, Any] = {"tool": tool, "model": args.model, "device": args.device}
    result |= {"seconds": args.seconds, "client_procs": args.client_procs, "levels": []}
    if not stack.start():
        raise RuntimeError(f"stack did not start:\n{stack.tail()}")
    result["start_s"] = stack.start_s
    result["command"] = stack.command()
    clients = Clients(args.client_procs, preload=fn.__module__)
    try:
        for k, n in enumerate(levels):
            if k:
                time.sleep(args.settle)
            row = measure_level(stack, clients, fn, getattr(stack, face), n, args, folder)
            result["levels"].append(row)
            brief = {k: v for k, v in row.items() if k not in ("per_session", "processes")}
            print(json.dumps(brief), flush=True)
            args.out.write_text(json.dumps(result, indent=1) + "\n")
    finally:
        clients.close()
        stack.stop()
    args.out.write_text(json.dumps(result, indent=1) + "\n")


def run_cli(doc: str | None, default_levels: str, tool: str, fn_name: str, face: str) -> None:
    """A load generator's command line: the level options, then ``run_levels`` with ``tool``'s session
    function ``fn_name``, taken by its module's name so client processes (``--client-procs``) import it."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_level_options(parser, default_levels=default_levels)
    args = parser.parse_args()
    run_levels(args, tool, getattr(importlib.import_module(tool), fn_name), face)
