"""PersonaPlex frame-step benchmark on one GPU (issue 11): the talker's frame and Mimi, alone and together.

With the size-true ``personaplex-7b`` random-weight preset (bf16 LM, fp32 Mimi), for each batch of live
sessions and ring fill (10 % and 100 % of the 3000-position window; 100 % means the ring has wrapped):

* ``temporal``: embedding sum, one Helium step over the ring, out_norm, text head and text sampling;
* ``depformer``: the 8 inner steps with their sampling, on a fixed temporal output;
* ``frame``: the whole talker frame as the engine runs it (``PersonaPlexAdapter.decode_core``);
* ``mimi_encode`` / ``mimi_decode``: one 80 ms frame per session through the streaming slot pool;
* ``full``: frame + encode + decode, i.e. one duplex tick's device work;

each eager and CUDA-graphed (one graph per unit and bucket, as the stages capture them), greedy (the deploy
file's default) and sampled (moshi's server settings). Host-timed with a sync per call, like the reference.
Also: an eager profile (kernels per frame) and the start-up cost of capturing every graph bucket.

    python bench/families/personaplex/personaplex_gpu.py --out pp.json [--batches 1,8,32,64] \
        [--device cpu --size tiny]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from services.codec.models.mimi.config import MimiConfig
from services.codec.models.mimi.loader import random_init as random_mimi
from services.codec.models.mimi.presets import tiny_config as tiny_mimi_config
from services.codec.models.mimi.streaming import MimiStreamingCodec
from services.talker.models.personaplex.adapter import PersonaPlexAdapter
from services.talker.models.personaplex.config import parse_lm_config
from services.talker.models.personaplex.frame import commit, depformer_part, temporal_part
from services.talker.models.personaplex.loader import random_init
from services.talker.models.personaplex.presets import preset_config
from services.talker.sampling import SamplingParams
from voxstage.nn import fused

GREEDY = (SamplingParams(do_sample=False), SamplingParams(do_sample=False))
SAMPLED = (SamplingParams(temperature=0.7, top_k=25), SamplingParams(temperature=0.8, top_k=250))


class Bench:
    def __init__(self, device: str, iters: int) -> None:
        self.device = device
        self.iters = iters

    def sync(self) -> None:
        if self.device == "cuda":
            torch.cuda.synchronize()

    def timed(self, fn: Callable[[], object], iters: int | None = None, warmup: int = 3) -> dict[str, float]:
        for _ in range(warmup):
            fn()
        self.sync()
        times = []
        for _ in range(iters or self.iters):
            t0 = time.perf_counter()
            fn()
            self.sync()
            times.append(1e3 * (time.perf_counter() - t0))
        times.sort()
        return {"median_ms": statistics.median(times), "p99_ms": times[round(0.99 * (len(times) - 1))]}

    def graphed(self, fn: Callable[[], object]) -> Callable[[], object]:
        """``fn`` captured once (after a side-stream warm-up) and replayed; eager on CPU."""
        if self.device != "cuda":
            return fn
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            fn()
            fn()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        return graph.replay


def build(size: str, device: str, slots: int, window: int) -> tuple[PersonaPlexAdapter, MimiStreamingCodec]:
    config = parse_lm_config(preset_config(f"personaplex-{size}"))
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    lm = random_init(config, seed=0, device=device, dtype=dtype)
    adapter = PersonaPlexAdapter(lm)
    adapter.allocate(slots, min(window, config.context))
    mimi_config = MimiConfig() if size == "7b" else tiny_mimi_config()
    mimi = random_mimi(mimi_config, seed=1, device=device, dtype=torch.float32)
    return adapter, MimiStreamingCodec(mimi, slots)


def place_sessions(adapter: PersonaPlexAdapter, b: int, position: int, sampling: tuple) -> None:
    """Slots ``[0, b)`` live at ``position`` with random columns (cost does not depend on the values)."""
    st = adapter.state
    for slot in range(b):
        adapter.admit(slot, seed=slot, text=sampling[0], audio=sampling[1])
    st.column[:b] = torch.randint(0, 2048, st.column[:b].shape, device=st.column.device)
    st.column[:b, 0] = torch.randint(4, 200, (b,), device=st.column.device)
    st.user[:b] = torch.randint(0, 2048, st.user[:b].shape, device=st.user.device)
    st.steps[:b] = position
    st.active[:b] = True


def talker_units(adapter: PersonaPlexAdapter, b: int, attn_len: int, greedy: bool) -> dict[str, Callable]:
    h = torch.zeros(b, adapter.config.dim, device=adapter.device, dtype=adapter.dtype)
    text = torch.full((b,), 5, device=adapter.device, dtype=torch.int64)
    st, m = adapter.state, adapter.model
    steps = st.steps[:b].clone()

    def frame() -> None:
        adapter.decode_core(b, attn_len, int(greedy))
        st.steps[:b] = steps  # stay at the measured fill

    return {
        "temporal": lambda: temporal_part(m, adapter.kv, st, b, attn_len, greedy),
        "depformer": lambda: depformer_part(m, st, adapter.scratch, b, h, text, greedy),
        "frame": frame,
        "commit_only": lambda: commit(m, st, b, torch.zeros(b, 9, dtype=torch.int64, device=adapter.device)),
    }


def mimi_units(codec: MimiStreamingCodec, b: int, device: str) -> dict[str, Callable]:
    """One frame per session on slots ``[0, b)`` (the duplex codec's packed calls)."""
    pcm = torch.randn(b, codec.samples_per_frame, device=device) * 0.1
    codes = torch.randint(0, 2048, (b, 8, 1), device=device)
    return {
        "mimi_encode": lambda: codec.encode_packed(pcm),
        "mimi_decode": lambda: codec.decode_packed(codes),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    bench = Bench(args.device, args.iters)
    batches = [int(x) for x in args.batches.split(",")]
    adapter, codec = build(args.size, args.device, max(batches), args.window)
    window = adapter.window
    fills = {"10pct": max(1, window // 10), "100pct": window + window // 10}
    out: dict[str, Any] = {
        "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
        "torch": torch.__version__,
        "size": args.size,
        "window": window,
        "params": sum(p.numel() for p in adapter.model.parameters()),
        "results": [],
    }
    if args.device == "cuda":
        out["memory_after_alloc_gib"] = torch.cuda.memory_allocated() / 2**30
    modes = ("eager", "graph") if args.device == "cuda" else ("eager",)
    for b in batches:
        for fill_name, position in fills.items():
            for sampled in (False, True):
                place_sessions(adapter, b, position, SAMPLED if sampled else GREEDY)
                attn_len = adapter.attn_bucket(position)
                units = talker_units(adapter, b, attn_len, greedy=not sampled)
                if not sampled:
                    units |= mimi_units(codec, b, args.device)
                for mode in modes:
                    fns = {k: (bench.graphed(f) if mode == "graph" else f) for k, f in units.items()}
                    row: dict[str, Any] = {"batch": b, "fill": fill_name, "position": position}
                    row |= {"attn_len": attn_len, "sampled": sampled, "mode": mode}
                    iters = args.iters if mode == "graph" else max(5, args.iters // 4)
                    for name, fn in fns.items():
                        row[name] = bench.timed(fn, iters)
                    if "mimi_encode" in fns:
                        parts = (fns["frame"], fns["mimi_encode"], fns["mimi_decode"])
                        row["full"] = bench.timed(lambda: [f() for f in parts], iters)  # noqa: B023
                    out["results"].append(row)
                    shown = {k: (v["median_ms"] if isinstance(v, dict) else v) for k, v in row.items()}
                    print(json.dumps(shown), flush=True)
    if args.device == "cuda":
        out["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
        out["profile"] = profile(adapter, codec, batches)
        if fused.triton_available():
            out["unfused"] = unfused(bench, adapter, batches, fills)
    return out


def unfused(
    bench: Bench, adapter: PersonaPlexAdapter, batches: list[int], fills: dict[str, int]
) -> list[dict]:
    """The lever check: the graphed greedy frame with the Triton kernels off (PyTorch glue ops)."""
    rows = []
    previous = fused.set_triton(False)
    try:
        for b in batches:
            for fill_name, position in fills.items():
                place_sessions(adapter, b, position, GREEDY)
                units = talker_units(adapter, b, adapter.attn_bucket(position), greedy=True)
                row: dict[str, Any] = {"batch": b, "fill": fill_name}
                for name in ("temporal", "depformer", "frame"):
                    row[name] = bench.timed(bench.graphed(units[name]))
                rows.append(row)
                print(
                    "unfused",
                    json.dumps({k: (v["median_ms"] if isinstance(v, dict) else v) for k, v in row.items()}),
                )
    finally:
        fused.set_triton(previous)
    return rows


def profile(adapter: PersonaPlexAdapter, codec: MimiStreamingCodec, batches: list[int]) -> dict[str, Any]:
    """Kernels per eager unit and the top kernels by device time (greedy, 10 % fill)."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    found: dict[str, Any] = {}
    for b in sorted({batches[0], batches[-1]}):
        place_sessions(adapter, b, adapter.window // 10, GREEDY)
        units = talker_units(adapter, b, adapter.attn_bucket(adapter.window // 10), True)
        units |= mimi_units(codec, b, "cuda")
        for name in ("frame", "temporal", "depformer", "mimi_encode", "mimi_decode"):
            units[name]()
            torch.cuda.synchronize()
            with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
                units[name]()
                torch.cuda.synchronize()
            events = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
            total_us = sum(e.device_time for e in events)
            by_name: dict[str, float] = {}
            for e in events:
                by_name[e.name] = by_name.get(e.name, 0.0) + e.device_time
            top = sorted(by_name.items(), key=lambda kv: -kv[1])[:8]
            found[f"{name}_b{b}"] = {
                "kernels": len(events),
                "device_ms": total_us / 1e3,
                "top": [{"kernel": k[:90], "ms": round(v / 1e3, 3)} for k, v in top],
            }
    return found


def capture_cost(args: argparse.Namespace) -> dict[str, Any]:
    """Start-up: capturing every (batch, context, greedy) bucket of a ``max(batches)``-slot talker."""
    adapter, _ = build(args.size, args.device, max(int(x) for x in args.batches.split(",")), args.window)
    adapter.enable_cuda_graphs()
    t0 = time.perf_counter()
    n = adapter.capture_all_graphs()
    return {"graphs": n, "seconds": time.perf_counter() - t0, "keys": len(adapter.graph_keys())}


def add_model_args(parser: argparse.ArgumentParser, *, batches: str, iters: int) -> None:
    """The options of the PersonaPlex GPU benchmarks: output, preset size, device, batches, ring, timing."""
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--size", choices=("7b", "tiny"), default="7b")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--batches", default=batches)
    parser.add_argument("--window", type=int, default=3000)
    parser.add_argument("--iters", type=int, default=iters)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_model_args(parser, batches="1,8,32,64", iters=40)
    parser.add_argument("--capture", action="store_true", help="also time capturing every graph bucket")
    args = parser.parse_args()
    torch.manual_seed(0)
    result = run(args)
    if args.capture and args.device == "cuda":
        torch.cuda.empty_cache()
        result["capture_all"] = capture_cost(args)
    args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    with torch.inference_mode():
        main()
