"""A join burst at the talker's engine: ``--streams`` requests submitted at once, as a closed loop's wave of
clients arrives (issue 28: at 192-256 streams joining together the first audio took 0.4-0.55 s on the H200).

Each request's prompt is built on the engine thread when it is submitted (``TalkerEngine.submit``, the
family's ``prepare``), one after another, before the engine's next step; then the engine prefills and steps
them. Measured on the real engine and the preset's talker (the default family's demo preset on the CPU,
any preset on a GPU): the host time of every submit (the burst's total and a request's p50), and the wall
time from the first submit to every request's first frame, with the engine's ticks to get there. Requests
are the load generator's prompts (``bench/prompts/en_sentences.txt``) with the family's bench voice and
language, whole text, greedy. Run it on two checkouts to compare:

    PYTHONPATH=src:. python -m bench.talker_burst --out burst.json --streams 64 --repeats 5
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

from bench.loadgen import PROMPTS
from services.talker.engine import EngineConfig, TalkerEngine
from services.talker.engine_types import TalkerRequest
from services.talker.models import load_talker
from services.talker.sampling import SamplingParams
from services.talker.spec import SpeechSpec
from voxstage import families
from voxstage.presets import resolve_model


def texts() -> list[str]:
    lines = PROMPTS.read_text().splitlines()
    return [line for line in lines if line.strip() and not line.startswith("#")]


def burst(engine: TalkerEngine, specs: list[SpeechSpec], tag: str, sync: Any) -> dict[str, Any]:
    """All of ``specs`` submitted at once, then steps until each has a frame; the engine idle after."""
    greedy = SamplingParams(do_sample=False)
    submits = []
    first: dict[str, float] = {}
    sync()
    t0 = time.perf_counter()
    for i, spec in enumerate(specs):
        request = TalkerRequest(f"{tag}-{i}", spec, seed=i, sampling=greedy, subtalker=greedy, max_frames=2)
        t = time.perf_counter()
        engine.submit(request)
        submits.append(time.perf_counter() - t)
    submitted = time.perf_counter() - t0
    ticks = 0
    while len(first) < len(specs):
        for out in engine.step():
            if out.codes.shape[0] and out.request_id not in first:
                first[out.request_id] = time.perf_counter() - t0
        ticks += 1
    while engine.has_work():  # the rest of each request (two frames), untimed
        engine.step()
    return {
        "submit_total_ms": round(1e3 * submitted, 3),
        "submit_p50_ms": round(1e3 * statistics.median(submits), 4),
        "first_frame_p50_ms": round(1e3 * statistics.median(first.values()), 3),
        "first_frame_max_ms": round(1e3 * max(first.values()), 3),
        "ticks_to_all_first_frames": ticks,
    }


def main(argv: list[str] | None = None) -> int:
    fam = families.default_family()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--model", default=fam.demo[0] if fam.demo else None, help="a preset")
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--streams", type=int, default=64, help="requests in the burst (and engine slots)")
    ap.add_argument("--repeats", type=int, default=5, help="bursts, after one unmeasured")
    ap.add_argument("--max-model-len", type=int, default=512)
    a = ap.parse_args(argv)
    found = families.preset(a.model)
    if found is None or found[0].bench is None:
        ap.error(f"--model: {a.model!r} is not a preset of a family with a bench voice")
    bench = found[0].bench
    dtype = torch.bfloat16 if a.device == "cuda" else torch.float32
    adapter, _ = load_talker(resolve_model(a.model), device=a.device, dtype=dtype)
    if a.device == "cuda":
        adapter.enable_cuda_graphs()
    cfg = EngineConfig(
        max_num_seqs=a.streams, max_model_len=a.max_model_len, max_num_batched_tokens=8 * 128,
        async_scheduling=a.device == "cuda",
    )  # fmt: skip
    engine = TalkerEngine(adapter, cfg)

    def sync() -> None:
        if a.device == "cuda":
            torch.cuda.synchronize()

    lines = texts()
    runs = []
    for r in range(a.repeats + 1):
        picked = [lines[(r * a.streams + i) % len(lines)] for i in range(a.streams)]
        specs = [SpeechSpec(text=text, voice=bench.voice, language=bench.language) for text in picked]
        row = burst(engine, specs, f"b{r}", sync)
        if r:  # the first burst warms the engine (graphs, allocators, caches)
            runs.append(row)
            print(json.dumps(row), flush=True)
    best = min(runs, key=lambda row: row["submit_total_ms"])
    doc = {
        "tool": "bench.talker_burst", "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "model": a.model,
        "device": a.device, "streams": a.streams, "runs": runs, "best": best,
        "median_submit_total_ms": statistics.median(row["submit_total_ms"] for row in runs),
        "median_first_frame_max_ms": statistics.median(row["first_frame_max_ms"] for row in runs),
    }  # fmt: skip
    a.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {a.out}: submits {doc['median_submit_total_ms']:.1f} ms for {a.streams} requests, all "
          f"first frames by {doc['median_first_frame_max_ms']:.1f} ms (medians of {len(runs)})")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
