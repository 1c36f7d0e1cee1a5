"""The TTS codec engine's own Python per stream-frame (issue 28): what its engine thread spends, with the GIL
held, around the decode at N streams (at 256 paced Qwen3-TTS streams on an H100 the engine thread ran 64 %
of a core).

The serving engine, built by the codec stage's ``build_engine`` from the default family's deploy file (the
benchmarks' text-to-speech family, Qwen3-TTS today) on its tiny preset with N slots (one lane, or two with
``--lanes``), runs a steady load: N streams of ``--frames`` frames each, started over the first chunk's worth
of steps and each replaced by a new stream when it ends, every live stream's next frame pushed on each talker
step (the worker's one hand-off per step), then the engine stepped until it has nothing to do. Ticks are
planned as served (``--policy deadline``: bounded ticks over a cost table of the H200's shape; ``fifo``). Only
the batched decode is replaced by one that returns a ready buffer of the right shape at once, so the CPU time
left is the engine's Python and array work, which a GPU does not shorten. CPU µs per stream-frame, best of
``--repeats``; compare two checkouts by running it in each.

    PYTHONPATH=src:. python -m bench.codec_engine_python --out py.json --streams 64,256
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from services.codec.calls import DecodeCalls
from services.codec.decode_cost import DecodeCost
from services.codec.engine import CodecEngine
from services.codec.main import build_engine
from services.codec.models import load_codec
from voxstage import families
from voxstage.config import load_deploy_config
from voxstage.presets import resolve_model

ROOT = Path(__file__).resolve().parents[1]


class ReadyDecode(DecodeCalls):
    """The engine's batched decode, answered at once with a buffer of the right shape."""

    def __init__(self, spf: int, max_rows: int, max_frames: int) -> None:
        self.wav = torch.zeros(max_rows, max_frames * spf)
        self.spf = spf
        super().__init__(self._ready)

    def _ready(self, codes: torch.Tensor, slots: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        return self.wav[: codes.shape[0], : codes.shape[2] * self.spf]


def h200_like(buckets: tuple[int, ...], max_rows: int) -> DecodeCost:
    """A cost table of the H200's shape in fp32 (2.4 ms a call + 66 µs a frame row: docs/benchmarks.md)."""
    rows = [1 << i for i in range(max_rows.bit_length())]
    return DecodeCost({(b, t): 2.4e-3 + 66e-6 * b * t for b in rows for t in buckets})


def build(streams: int, policy: str, lanes: bool) -> CodecEngine:
    sets = [f"stages.1.max_num_seqs={streams}", f"stages.0.max_num_seqs={streams}"]
    if lanes:
        sets += ["stages.1.codec_urgent_lane_ms=10", "stages.1.codec_tick_budget_ms=60"]
    fam = families.default_family()
    assert fam.demo is not None
    config = load_deploy_config(ROOT / fam.deploy_file, platform="cpu", overrides=sets)
    runtime = load_codec(resolve_model(fam.demo[0]), device="cpu", dtype=torch.float32, max_streams=streams)
    engine = build_engine(config, runtime, "cpu")
    ready = ReadyDecode(runtime.samples_per_frame, streams, 100)
    engine.calls = engine.decode_fn = ready
    if lanes:
        engine.bulk.calls = ready  # type: ignore[attr-defined]
        engine.urgent.calls = ReadyDecode(runtime.samples_per_frame, streams, 100)  # type: ignore[attr-defined]
    engine.frame_buckets = (1, 2, 4, 8, 16, 25, 32, 64, 100)  # served on a GPU (calls.sh's capture sizes)
    engine.tick_policy = policy  # type: ignore[assignment]  # the CPU stage runs fifo; the GPU's is asked for
    engine.cost = h200_like(engine.frame_buckets, streams)
    return engine


def measure(streams: int, frames: int, steps: int, repeats: int, policy: str, lanes: bool) -> dict[str, Any]:
    engine = build(streams, policy, lanes)
    groups = engine.num_groups
    codes = np.random.default_rng(0).integers(0, engine.codebook_size, (frames, groups), dtype=np.int64)
    live: dict[str, int] = {}  # stream id -> frames pushed
    out: dict[str, int] = {}  # stream id -> frames handed out, until its last audio
    ended = complete = 0  # streams whose last audio came out; of them, those with all their frames
    opened = 0
    start_over = 25  # streams start over the first steady chunk's worth of steps: their phases differ

    def talker_step(step: int) -> int:
        nonlocal opened
        while len(live) < min(streams, streams * (step + 1) // start_over):
            sid = f"s{opened}"
            opened += 1
            engine.open(sid)
            live[sid] = 0
        pushed = 0
        for sid, n in list(live.items()):
            engine.push(sid, codes[n : n + 1])
            pushed += 1
            live[sid] = n + 1
            if n + 1 == frames:
                engine.finish(sid)
                del live[sid]  # its slot comes back when the engine hands out its last audio
        nonlocal ended, complete
        while engine.has_work() or engine.idle_timeout() is not None:
            for o in engine.step():
                out[o.stream_id] = out.get(o.stream_id, 0) + o.frames
                if o.final:
                    ended += 1
                    complete += out.pop(o.stream_id) == frames
        return pushed

    for step in range(frames):  # the ramp-up and one generation of streams: not the steady state
        talker_step(step)
    best, ticks = float("inf"), engine.ticks
    for _ in range(repeats):
        t0, pushed = time.process_time(), 0
        for step in range(steps):
            pushed += talker_step(frames + step)
        best = min(best, (time.process_time() - t0) / pushed)
    return {
        "streams": streams, "policy": policy, "lanes": lanes, "frames": frames, "steps": steps,
        "engine_ticks": engine.ticks - ticks, "cpu_us_per_stream_frame": 1e6 * best,
        "streams_opened": opened, "streams_ended": ended, "streams_complete": complete,
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--streams", default="64,256")
    ap.add_argument("--frames", type=int, default=100, help="frames a stream (the closed search's 100)")
    ap.add_argument("--steps", type=int, default=100, help="talker steps measured a repeat")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--policy", choices=("deadline", "fifo"), default="deadline")
    ap.add_argument("--lanes", action="store_true", help="two lanes (codec_urgent_lane_ms 10, bulk 60 ms)")
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    rows = [measure(int(n), a.frames, a.steps, a.repeats, a.policy, a.lanes) for n in a.streams.split(",")]
    for row in rows:
        print(json.dumps(row))
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps({"tool": "bench.codec_engine_python", "levels": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
