"""A/B of the codec engine's tick schedules on the codec alone (issue 14's early hand-out, issue 28's bounded
deadline ticks).

Arms (``--arms``, comma-separated):

* ``fifo``: ``codec_tick_policy: fifo`` with the early hand-out on (issue 14's default): every ready chunk
  each tick; an async step that has audio in hand returns without waiting for a bulk decode still running.
* ``fifo-off``: the same without the early hand-out (``engine.early_handout`` off).
* ``deadline`` or ``deadline:MS``: ``codec_tick_policy: deadline`` (services/codec/schedule.py): chunks by
  playback deadline within a tick budget of MS ms of estimated device time (default: the deploy file's
  ``codec_tick_budget_ms``), from the cost table the warm-up measures (written into the arm's record).
* ``lanes:U:B``: two lanes (``codec_urgent_lane_ms`` U, services/codec/lanes.py): first and ramp chunks in
  deadline ticks of U ms on a high-priority CUDA stream, steady chunks in deadline ticks of B ms on a
  low-priority one.
* ``on`` / ``off``: issue 14's names of ``fifo`` / ``fifo-off``.

Engines are built as the codec stage builds them (``services.codec.main.build_engine`` over ``load_codec``,
the deploy file's chunk schedule, frame buckets and ``async_scheduling``; CUDA graphs pre-captured and the
decode costs measured by the stage's own warm-up, ``CodecWorker.warm_up``), a fresh one per arm. Workload,
closed-loop on the wall clock, one thread (what the talker sends): ``--streams`` streams open, started over
the first second; each gets one random codec frame every ``--frame-interval-ms`` until it has ``--frames``,
then finishes, and a new (young) stream takes its place. Streams that start within the ``--duration`` s
after ``--warmup`` are measured (replacements keep the load up until they have all ended). Per stream: first
audio (first frame pushed to first non-empty PCM), gaps between chunks, and underruns (``bench.playback``: a
player with no prebuffer from the first audio at 24 kHz runs dry before the next chunk arrives). Per arm:
audio-s per wall-s (throughput: with 64 streams fed 8x faster than real time the codec is the bound), steps
and their wall time, and for deadline arms the estimated device time of each tick (p50 / max).

Usage: ``python -m bench.codec_schedule --out codec_schedule.json`` (GPU, the default family's first
benchmarked preset, 64 streams, arms fifo,fifo-off,deadline); ``--device cpu --quick`` is a smoke run on its
tiny preset (eager, same code path). JSON is rewritten after each arm; a table is printed.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import gc
import json
import logging
import platform
import time
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np
import torch

from services.codec.engine import CodecEngine
from services.codec.lanes import LanedCodecEngine
from services.codec.main import build_engine
from services.codec.models import CodecRuntime, load_codec
from services.codec.worker import CodecWorker
from voxstage import families
from voxstage.stage.process import load_stage_setup

try:
    from bench.playback import percentile, simulate_playback
except ModuleNotFoundError:  # run as a file (python bench/codec_schedule.py): bench/ itself is on sys.path
    from playback import percentile, simulate_playback  # type: ignore[no-redef]

ROOT = Path(__file__).resolve().parents[1]
log = logging.getLogger("bench.codec_schedule")


@dataclass
class Stream:
    sid: str
    start: float  # when its first frame is due (perf_counter s)
    measured: bool
    codes: np.ndarray  # [frames, groups]
    pushed: int = 0
    first_push: float | None = None
    arrivals: list[tuple[float, int]] = field(default_factory=list)  # (time, samples) of non-empty PCM
    ended: bool = False


def warm_up(runtime: CodecRuntime, engine: CodecEngine) -> float:
    """The stage's start-up on an engine thread of its own (``CodecWorker.warm_up``): a short stream, then
    the graphs of every (batch, frames) bucket up to max_streams x the steady chunk."""

    async def run() -> float:
        worker = CodecWorker(runtime, engine)
        worker.start(asyncio.get_running_loop())
        try:
            return await worker.warm_up()
        finally:
            worker.stop()

    return asyncio.run(run())


def graphs(engine: CodecEngine) -> int:
    return len(engine.decode_fn.graphs) if engine.decode_fn is not None else 0


def dist(values: list[float]) -> dict[str, float | None]:
    return {f"p{q}": percentile(values, q) for q in (50, 95, 99)} | {"max": max(values, default=None)}


ARM_ALIASES = {"on": "fifo", "off": "fifo-off"}


def lane_budgets(arm: str) -> tuple[float, float] | None:
    """``(urgent, bulk)`` ms of a ``lanes:U:B`` arm (None: another arm; (-1, -1): a malformed one)."""
    name, _, budgets = arm.partition(":")
    if name != "lanes":
        return None
    try:
        urgent, bulk = (float(ms) for ms in budgets.split(":"))
    except ValueError:
        return -1.0, -1.0
    return urgent, bulk


def lane_ms(arm: str) -> float | None:
    """The urgent lane's budget of a ``lanes:U:B`` arm (None: one lane)."""
    budgets = lane_budgets(arm)
    return None if budgets is None else budgets[0]


def parse_arm(arm: str) -> tuple[str, bool, float | None]:
    """``(policy, early hand-out, budget ms or None for the deploy file's)`` of an ``--arms`` entry."""
    name, _, budget = ARM_ALIASES.get(arm, arm).partition(":")
    lanes = lane_budgets(arm)
    if lanes is not None and min(lanes) > 0:
        return "deadline", True, lanes[1]
    if name in ("fifo", "fifo-off") and not budget:
        return "fifo", name == "fifo", None
    if name == "deadline":
        try:
            ms = float(budget) if budget else None
        except ValueError:
            ms = -1.0
        if ms is None or ms > 0:
            return "deadline", True, ms
    raise ValueError(f"--arms: {arm!r} is not fifo, fifo-off, deadline, deadline:MS or lanes:U:B (all > 0)")


def configure(engine: CodecEngine, arm: str) -> None:
    """Set ``engine`` up for ``arm`` before its warm-up (which measures decode costs for deadline arms)."""
    policy, handout, budget_ms = parse_arm(arm)
    engine.tick_policy, engine.early_handout = policy, handout  # type: ignore[assignment]
    if budget_ms is not None:
        engine.tick_budget_s = budget_ms / 1e3


def run_arm(arm: str, runtime: CodecRuntime, engine: CodecEngine, a: argparse.Namespace) -> dict[str, Any]:
    rng = np.random.default_rng(a.seed)  # the same codes in every arm
    sr, dt, n_frames = runtime.sample_rate, a.frame_interval_ms / 1e3, a.frames
    t0 = time.perf_counter()
    win0, win1 = t0 + a.warmup, t0 + a.warmup + a.duration
    cap = win1 + max(30.0, 3 * n_frames * dt)  # measured streams that have not ended by then are cut
    counter = 0

    def new_stream(start: float) -> Stream:
        nonlocal counter
        counter += 1
        codes = rng.integers(0, runtime.codebook_size, (n_frames, runtime.num_groups), dtype=np.int64)
        return Stream(f"s{counter}", start, win0 <= start < win1, codes)

    waiting = [new_stream(t0 + i / a.streams) for i in range(a.streams)]  # staggered over the first second
    live: dict[str, Stream] = {}
    done: list[Stream] = []
    steps, step_s, samples, lazy0 = 0, 0.0, 0, graphs(engine)
    planned: list[float] = []  # deadline: each tick's estimated device ms
    while True:
        now = time.perf_counter()
        if now >= cap or (now >= win1 and not any(s.measured for s in (*waiting, *live.values()))):
            break
        for s in [s for s in waiting if s.start <= now]:
            waiting.remove(s)
            engine.open(s.sid)
            live[s.sid] = s
        for s in live.values():
            while s.pushed < n_frames and s.start + s.pushed * dt <= now:
                engine.push(s.sid, s.codes[s.pushed : s.pushed + 1])
                s.first_push = now if s.first_push is None else s.first_push
                s.pushed += 1
            if s.pushed == n_frames and not s.ended:
                engine.finish(s.sid)
                s.ended = True
        if not engine.has_work():
            time.sleep(0.0002)
            continue
        t_step = time.perf_counter()
        engine.planned_s = 0.0
        outputs = engine.step()
        t_out = time.perf_counter()
        in_window = win0 <= t_step < win1
        steps += in_window
        if in_window and engine.planned_s:
            planned.append(1e3 * engine.planned_s)
        step_s += (t_out - t_step) * in_window
        for o in outputs:
            s = live[o.stream_id]
            if o.pcm.size:
                s.arrivals.append((t_out, o.pcm.size))
                samples += o.pcm.size * in_window
            if o.final:
                done.append(live.pop(o.stream_id))
                waiting.append(new_stream(t_out))  # a young stream in its place
    for sid in list(live):
        engine.cancel(sid)
    measured = [s for s in (*done, *live.values()) if s.measured]
    first = [1e3 * (s.arrivals[0][0] - t) for s in measured if s.arrivals and (t := s.first_push) is not None]
    gaps = [1e3 * (tb - ta) for s in measured for (ta, _), (tb, _) in pairwise(s.arrivals)]
    # The ramp's tightest deadline: the second chunk, due 80 ms after a 1-frame first chunk's arrival.
    second = [1e3 * (s.arrivals[1][0] - s.arrivals[0][0]) for s in measured if len(s.arrivals) > 1]
    plays = [simulate_playback(s.arrivals, sr) for s in measured]
    return {
        "arm": arm, "policy": engine.tick_policy, "early_handout": engine.early_handout,
        "tick_budget_ms": 1e3 * engine.tick_budget_s if engine.tick_policy == "deadline" else None,
        "tick_planned_ms": dist(planned) if planned else None,
        "urgent_lane_ms": 1e3 * engine.urgent.budget_s if isinstance(engine, LanedCodecEngine) else None,
        "decode_cost": engine.cost.as_json() if engine.cost is not None else None,
        "streams_started": len(measured),
        "streams_unfinished": sum(s.sid in live for s in measured),
        "streams_without_audio": sum(not s.arrivals for s in measured),
        "first_audio_ms": dist(first), "chunk_gap_ms": dist(gaps), "second_chunk_gap_ms": dist(second),
        "steps": steps, "step_ms_mean": 1e3 * step_s / steps if steps else None,
        "audio_s": samples / sr, "audio_s_per_wall_s": samples / sr / a.duration,
        "underruns": sum(p.stalls > 0 for p in plays), "stalls": sum(p.stalls for p in plays),
        "stall_max_ms": 1e3 * max((p.stall_max_s for p in plays), default=0.0),
        # Where each underrunning stream first ran dry in its audio (0.08 s: just after a 1-frame chunk).
        "first_stall_audio_s": dist([p.first_stall_at_s for p in plays if p.first_stall_at_s is not None]),
        "graphs_captured_in_run": graphs(engine) - lazy0,
    }  # fmt: skip


def table(arms: list[dict[str, Any]]) -> str:
    def f(v: float | None) -> str:
        return "-" if v is None else f"{v:.1f}"

    row = "{:<12} {:>7}  {:<34} {:<16} {:<20} {:>6}  {:>7}  {:>9}  {:>9}".format
    lines = [row("arm", "streams", "first audio ms p50/p95/p99/max", "gap ms p95/max", "2nd chunk ms p50/max",
                 "steps", "step ms", "audio-s/s", "underruns")]  # fmt: skip
    for r in arms:
        fa, gap, second = r["first_audio_ms"], r["chunk_gap_ms"], r["second_chunk_gap_ms"]
        lines.append(row(
            r["arm"], r["streams_started"], "/".join(f(fa[k]) for k in ("p50", "p95", "p99", "max")),
            f"{f(gap['p95'])}/{f(gap['max'])}", f"{f(second['p50'])}/{f(second['max'])}", r["steps"],
            f(r["step_ms_mean"]),
            f"{r['audio_s_per_wall_s']:.2f}", r["underruns"],
        ))  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    fam = families.default_family()
    assert fam.bench is not None and fam.demo is not None
    big, tiny = fam.bench.default_models[0], fam.demo[0]
    ap.add_argument("--model", default=None, help=f"preset or checkpoint (default {big}; cpu: {tiny})")
    ap.add_argument("--config", default=str(ROOT / fam.deploy_file), help="deploy file")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--platform", default=None)
    ap.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"],
                    help="auto: the codec stage's default (float32)")  # fmt: skip
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--quick", action="store_true", help="short defaults (smoke: 4 streams x 12 frames, 2 s)")
    ap.add_argument("--streams", type=int, default=None, help="concurrent streams (default 64)")
    ap.add_argument("--frames", type=int, default=None, help="frames per stream (default 100 = 8 s)")
    ap.add_argument("--frame-interval-ms", type=float, default=10.0)
    ap.add_argument("--duration", type=float, default=None, help="measured s per arm (default 20)")
    ap.add_argument("--warmup", type=float, default=None, help="unmeasured s per arm first (default 3)")
    ap.add_argument(
        "--arms",
        default="fifo,fifo-off,deadline",
        help="fifo, fifo-off, deadline[:MS], lanes:U:B (docstring)",
    )
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    quick = {"streams": 4, "frames": 12, "duration": 2.0, "warmup": 0.5}
    full = {"streams": 64, "frames": 100, "duration": 20.0, "warmup": 3.0}
    for k, v in (quick if a.quick else full).items():
        setattr(a, k, v if getattr(a, k) is None else getattr(a, k))
    a.model = a.model or (tiny if a.device == "cpu" else big)
    arms = [arm for arm in a.arms.split(",") if arm]
    for arm in arms:
        try:
            parse_arm(arm)
        except ValueError as exc:
            ap.error(str(exc))
    logging.basicConfig(level=logging.WARNING)
    # The codec stage's setup with a slot per stream, in both stages as run_gpu.py's --slots (stage 1: codec).
    a.overrides = [*a.overrides, *(f"stages.{i}.max_num_seqs={a.streams}" for i in (0, 1))]
    config, device, dtype, source = load_stage_setup(a, log, cuda_default="float32", role="codec")
    runtime = load_codec(source, device=device, dtype=dtype, max_streams=a.streams, config=config)
    plan = config.chunk_plan
    report: dict[str, Any] = {
        "config": {k: v for k, v in vars(a).items() if k != "out"} | {
            "dtype": str(dtype).removeprefix("torch."), "async_scheduling": config.codec.async_scheduling,
            "chunks": [plan.initial_frames, plan.steady_frames], "ramp": plan.ramp,
        },
        "device_name": torch.cuda.get_device_name() if device == "cuda" else platform.processor() or "cpu",
        "torch": torch.__version__,
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "arms": [],
    }  # fmt: skip
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    for arm in arms:
        arm_config = config
        if (urgent := lane_ms(arm)) is not None:  # the laned engine is the stage's, built from the key
            lanes = [*a.overrides, f"stages.1.codec_urgent_lane_ms={urgent:g}"]
            arm_config = load_stage_setup(argparse.Namespace(**vars(a) | {"overrides": lanes}), log,
                                          cuda_default="float32", role="codec")[0]  # fmt: skip
        engine = build_engine(arm_config, runtime, device)
        configure(engine, arm)
        warm_s = warm_up(runtime, engine)
        rec = run_arm(arm, runtime, engine, a) | {
            "warm_up_s": warm_s, "graphs": graphs(engine), "frame_buckets": list(engine.frame_buckets),
        }  # fmt: skip
        report["arms"].append(rec)
        out.write_text(json.dumps(report, indent=1))
        if device == "cuda":  # the cut streams' last decodes finish before the next arm's engine starts
            torch.cuda.synchronize()
        del engine
        gc.collect()
        if device == "cuda":
            torch.cuda.empty_cache()
    print(table(report["arms"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
