"""Device memory and time the codec stage's start-up takes for its CUDA graphs (issue 28).

On an 80 GB H100 the Qwen3-TTS stack with 256 slots did not start (seventeenth session): its codec captured a
graph for every (batch, frames) bucket up to 256 x 25 frame rows, and one 6,400-row graph alone reserved
about 50 GiB of pool. Under bounded (deadline) ticks no call but a single row's may exceed the tick budget, so
the stage now times its calls first and captures only the buckets within it. This runs the stage's own
warm-up (``CodecWorker.warm_up`` over ``services.codec.main.build_engine``, as ``bench/codec_schedule.py``
does) and writes the memory it reserved, the graphs and the time; a failed capture is recorded, not raised::

    python -m bench.graph_pool --out pool.json --streams 256
    python -m bench.graph_pool --out pool_fifo.json --streams 256 --set stages.1.codec_tick_policy=fifo
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path
from typing import Any

import torch

from bench.codec_schedule import warm_up
from services.codec.main import build_engine
from services.codec.models import load_codec
from voxstage import families
from voxstage.stage.process import load_stage_setup

ROOT = Path(__file__).resolve().parents[1]
log = logging.getLogger("bench.graph_pool")
GIB = 2**30


def main(argv: list[str] | None = None) -> int:
    fam = families.default_family()
    assert fam.bench is not None
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--model", default=fam.bench.default_models[0], help="preset or checkpoint")
    ap.add_argument("--config", default=str(ROOT / fam.deploy_file), help="deploy file")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--platform", default=None)
    ap.add_argument("--device", default="cuda", choices=["cuda"])
    ap.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"])
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--streams", type=int, default=256, help="the codec stage's max_num_seqs")
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    a.overrides = [*a.overrides, f"stages.1.max_num_seqs={a.streams}"]
    config, device, dtype, source = load_stage_setup(a, log, cuda_default="float32", role="codec")
    runtime = load_codec(source, device=device, dtype=dtype, max_streams=a.streams, config=config)
    engine = build_engine(config, runtime, device)
    if engine.decode_fn is None:
        ap.error("the deploy's codec is eager (enforce_eager): it captures no graphs")
    torch.cuda.synchronize()
    before = torch.cuda.memory_reserved()
    report: dict[str, Any] = {
        "device_name": torch.cuda.get_device_name(), "torch": torch.__version__, "model": a.model,
        "dtype": str(dtype).removeprefix("torch."), "streams": a.streams, "tick_policy": engine.tick_policy,
        "tick_budget_ms": 1e3 * engine.tick_budget_s, "frame_buckets": list(engine.frame_buckets),
        "reserved_before_gib": before / GIB, "error": None,
    }  # fmt: skip
    t0 = time.perf_counter()
    try:
        warm_up(runtime, engine)
    except Exception as exc:  # an out-of-memory capture ends the stage's start-up: record what it said
        report["error"] = f"{type(exc).__name__}: {str(exc)[:400]}"
    torch.cuda.synchronize()
    report |= {
        "warm_up_s": time.perf_counter() - t0,
        "graphs": len(engine.decode_fn.graphs),
        "largest_graph_rows": max((b * t for b, t in engine.decode_fn.graphs.keys()), default=0),
        "graph_reserved_gib": (torch.cuda.memory_reserved() - before) / GIB,
        "peak_allocated_gib": torch.cuda.max_memory_allocated() / GIB,
        "cost": engine.cost.as_json() if engine.cost is not None else None,
    }
    Path(a.out).write_text(json.dumps(report, indent=1))
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
