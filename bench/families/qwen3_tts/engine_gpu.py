"""GPU micro-benchmarks of the engines with size-true random weights (issue: engines, acceptance 3 and 4).

Measures, on one CUDA device:
* talker frame step (talker token step + code predictor x15 + sampling, one tick of the engine's adapter) at
  batch 1/8/32/64, eager and CUDA-graphed, plus graph-vs-eager agreement of the sampled codes;
* codec streaming decode per (batch, chunk frames), eager and graphed, and audio-seconds per GPU-second;
* one request through TalkerEngine + CodecEngine: time to first PCM and real-time factor at concurrency 1;
* peak device memory against a ``gpu_memory_utilization`` budget.

Usage: ``python bench/families/qwen3_tts/engine_gpu.py --out results.json [--size 0.6b] [--quick]``.
Writes JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from services.codec.engine import ChunkSchedule, CodecEngine
from services.codec.graphs import GraphedDecode
from services.codec.models.qwen3_tts.loader import random_init as random_decoder
from services.codec.models.qwen3_tts.presets import decoder_preset
from services.codec.models.qwen3_tts.streaming import StreamingDecoder
from services.talker.engine import EngineConfig, TalkerEngine, TalkerRequest
from services.talker.models import load_talker
from services.talker.sampling import SamplingParams
from services.talker.spec import SpeechSpec
from voxstage.presets import resolve_model

DEV = "cuda"  # --device cpu runs the same code on the tiny preset (a smoke test of this script)


def sync() -> None:
    if DEV == "cuda":
        torch.cuda.synchronize()


SAMPLING = SamplingParams(do_sample=True, temperature=0.9, top_k=50, repetition_penalty=1.05)
TEXT = "The quick brown fox jumps over the lazy dog while the orchestra tunes up."


def timed_ms(fn: Callable[[], object], iters: int, warmup: int = 3) -> dict[str, float]:
    """Host-observed latency per call (synchronized), median and p99 in ms."""
    for _ in range(warmup):
        fn()
    sync()
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(1e3 * (time.perf_counter() - t0))
    times.sort()
    return {
        "median_ms": statistics.median(times),
        "p99_ms": times[min(len(times) - 1, int(0.99 * len(times)))],
    }


def admit_prompts(adapter, batch: int, text: str = TEXT) -> list:  # type: ignore[no-untyped-def]
    """Slots ``0..batch-1`` admitted with a prompt each; returns their whole-prompt prefill chunks."""
    chunks = []
    for slot in range(batch):
        p = adapter.prepare(SpeechSpec(text=f"{text} {slot}", voice="ryan", language="english"))
        adapter.admit(slot, p, seed=slot, sampling=SAMPLING, subtalker=SAMPLING, min_frames=2)
        adapter.append_text(slot, 0, list(p.trailing_ids), True)
        chunks.append((slot, p, 0, p.length - 1))
    return chunks


def setup_slots(adapter, batch: int) -> None:  # type: ignore[no-untyped-def]
    for chunk in admit_prompts(adapter, batch):
        adapter.prefill_many([chunk])
        adapter.start_decode(chunk[0], chunk[1])


def bench_prefill(adapter, iters: int) -> dict[str, object]:  # type: ignore[no-untyped-def]
    """One tick's prefill of 8 arrivals: one call per prompt (as before batching) vs one batched call."""
    chunks = admit_prompts(adapter, 8)
    return {
        "tokens": [c[3] for c in chunks],
        "one_ms": timed_ms(lambda: adapter.prefill_many(chunks[:1]), iters),
        "eight_separate_ms": timed_ms(lambda: [adapter.prefill_many([c]) for c in chunks], iters),
        "eight_batched_ms": timed_ms(lambda: adapter.prefill_many(chunks), iters),
    }


def bench_talker(size: str, batches: list[int], iters: int, modes: tuple[str, ...]) -> dict[str, object]:
    source = resolve_model(f"qwen3-tts-{size}")
    out: dict[str, object] = {}
    for mode in modes:
        adapter, info = load_talker(source, device=DEV, dtype=torch.bfloat16)
        adapter.allocate(max(batches), 1024)
        if mode != "eager":
            t0 = time.perf_counter()
            adapter.enable_cuda_graphs()
        rows = {}
        for b in batches:
            setup_slots(adapter, b)
            active = [True] * b
            # Every call advances each slot by one frame; the context bucket stays fixed (prompt ~60 + 100).
            rows[str(b)] = timed_ms(lambda a=active, ad=adapter: ad.decode(a, 256), iters)
        out[mode] = rows
        if max(batches) >= 8:
            out[f"{mode}_prefill"] = bench_prefill(adapter, iters)
        if mode != "eager":
            out[f"{mode}_captured"] = len(adapter.graphs) if adapter.graphs else 0
            out[f"{mode}_setup_s"] = time.perf_counter() - t0
        del adapter
        torch.cuda.empty_cache()
    out["graph_matches_eager"] = talker_graph_parity(source)
    return out


def talker_graph_parity(source) -> bool:  # type: ignore[no-untyped-def]
    codes = {}
    for mode in ("eager", "graph"):
        adapter, _ = load_talker(source, device=DEV, dtype=torch.bfloat16)
        adapter.allocate(4, 512)
        if mode == "graph":
            adapter.enable_cuda_graphs()
        setup_slots(adapter, 3)
        frames = [adapter.decode([True, True, True], 128)[0] for _ in range(12)]
        codes[mode] = np.stack(frames)
        del adapter
    return bool(np.array_equal(codes["eager"], codes["graph"]))


def bench_codec(size: str, batches: list[int], chunks: list[int], iters: int) -> dict[str, object]:
    model = random_decoder(decoder_preset(f"qwen3-tts-{size}"), 0, device=DEV, dtype=torch.bfloat16)
    max_b = max(batches)
    pool = StreamingDecoder(model, 2 * max_b)
    graphed = GraphedDecode(pool, num_groups=16, max_batch=max_b, frame_buckets=chunks, device=DEV)
    out: dict[str, object] = {"params": sum(p.numel() for p in model.parameters())}
    gen = torch.Generator(device=DEV).manual_seed(0)
    for mode in ("eager", "graph"):
        rows = {}
        for b in batches:
            for t in chunks:
                codes = torch.randint(0, 2048, (b, 16, t), device=DEV, generator=gen)
                slots = torch.arange(b, device=DEV)
                lengths = torch.full((b,), t, device=DEV)
                fn = (lambda c=codes, s=slots, n=lengths: pool.decode(c, s, n)) if mode == "eager" else (
                    lambda c=codes, s=slots, n=lengths: graphed(c, s, n)
                )  # fmt: skip
                r = timed_ms(fn, iters)
                r["audio_s_per_gpu_s"] = b * t * 0.08 / (r["median_ms"] / 1e3)
                rows[f"b{b}_t{t}"] = r
        out[mode] = rows
    # Graph vs eager on identical fresh streams.
    codes = torch.randint(0, 2048, (4, 16, chunks[0]), device=DEV, generator=gen)
    slots, lengths = torch.arange(4, device=DEV), torch.full((4,), chunks[0], device=DEV)
    pool.reset(slots)
    eager = pool.decode(codes, slots, lengths).float()
    pool.reset(slots)
    graph = graphed(codes, slots, lengths).float()
    out["graph_vs_eager_max_abs"] = float((eager - graph).abs().max())
    return out


def bench_end_to_end(size: str, graphs: bool, async_scheduling: bool = False) -> dict[str, float]:
    source = resolve_model(f"qwen3-tts-{size}")
    adapter, _ = load_talker(source, device=DEV, dtype=torch.bfloat16)
    if graphs:
        adapter.enable_cuda_graphs()
    # Both stages get the flag, as in the seed: without it the "graphs + async" rows were synchronous runs.
    talker = TalkerEngine(
        adapter,
        EngineConfig(
            max_num_seqs=8, max_model_len=1024, max_num_batched_tokens=512, async_scheduling=async_scheduling
        ),
    )
    model = random_decoder(decoder_preset(f"qwen3-tts-{size}"), 0, device=DEV, dtype=torch.bfloat16)
    pool = StreamingDecoder(model, 16)
    decode = GraphedDecode(
        pool, num_groups=16, max_batch=8, frame_buckets=(1, 25), device=DEV, enabled=graphs
    )
    codec = CodecEngine(pool, max_streams=8, schedule=ChunkSchedule(1, 25), num_groups=16, device=DEV,
                        decode_fn=decode, frame_buckets=(1, 25),
                        async_scheduling=async_scheduling)  # fmt: skip
    results = []
    for i in range(4):  # the first runs capture graphs
        t0 = time.perf_counter()
        spec = SpeechSpec(text=TEXT, voice="ryan", language="english")
        req = TalkerRequest(
            f"r{i}", spec, seed=i, sampling=SAMPLING, subtalker=SAMPLING, max_frames=100, min_frames=100
        )
        talker.submit(req)
        codec.open(req.request_id)
        first = None
        samples = 0
        done = False
        while not done:
            for o in talker.step():
                if o.codes.shape[0]:
                    codec.push(o.request_id, o.codes)
                if o.finish is not None:
                    codec.finish(o.request_id)
            for c in codec.step():
                if c.pcm.size and first is None:
                    first = time.perf_counter() - t0
                samples += c.pcm.size
                done = done or c.final
        wall = time.perf_counter() - t0
        results.append(
            {"ttfa_ms": 1e3 * (first or wall), "rtf": wall / (samples / 24000), "audio_s": samples / 24000}
        )
    return results[-1] | {"runs": results}  # type: ignore[return-value]


def memory_budget(size: str, utilization: float, slots: int, max_len: int) -> dict[str, float]:
    """The talker stage at the seed's settings: peak allocation against its share of the device."""
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    adapter, _ = load_talker(resolve_model(f"qwen3-tts-{size}"), device=DEV, dtype=torch.bfloat16)
    adapter.enable_cuda_graphs()
    engine = TalkerEngine(
        adapter, EngineConfig(max_num_seqs=slots, max_model_len=max_len, max_num_batched_tokens=512)
    )
    for i in range(slots):
        engine.submit(TalkerRequest(f"m{i}", SpeechSpec(text=TEXT, voice="ryan", language="english"), seed=i,
                                    sampling=SAMPLING, subtalker=SAMPLING, max_frames=40))  # fmt: skip
    while engine.has_work():
        engine.step()
    total = torch.cuda.get_device_properties(0).total_memory
    peak = torch.cuda.max_memory_allocated() - base
    return {
        "budget_gib": utilization * total / 2**30,
        "peak_gib": peak / 2**30,
        "kv_gib": adapter.kv_bytes_per_token() * slots * max_len / 2**30,
        "within_budget": bool(peak <= utilization * total),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--size", default="0.6b")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--talker-modes", default="eager,graph")
    ap.add_argument("--skip", default="", help="comma list of sections to skip: codec,e2e,e2e-eager,memory")
    ap.add_argument("--batches", default="1,8,32,64", help="talker and codec batch sizes")
    args = ap.parse_args()
    global DEV
    DEV = args.device
    if DEV == "cpu":
        torch.set_num_threads(1)
        size, batches, iters = "tiny", [1, 8], 3
        report = {"device": "cpu", "size": size}
        report["talker_frame_step"] = bench_talker(size, batches, iters, ("eager", "graph"))
        report["codec_decode"] = bench_codec(size, batches, [1, 5], iters)
        report["end_to_end_c1_eager"] = bench_end_to_end(size, graphs=False)
        Path(args.out).write_text(json.dumps(report, indent=2))
        print(json.dumps(report, indent=2))
        return
    torch.backends.cuda.matmul.allow_tf32 = True
    iters = 20 if args.quick else 50
    batches = [int(b) for b in args.batches.split(",")]
    report: dict[str, object] = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "size": args.size,
        "date": time.strftime("%Y-%m-%d"),
    }
    torch.cuda.reset_peak_memory_stats()
    modes = tuple(args.talker_modes.split(","))
    report["talker_frame_step"] = bench_talker(args.size, batches, iters, modes)
    report["talker_peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
    skip = set(args.skip.split(","))
    if "codec" not in skip:
        report["codec_decode"] = bench_codec(args.size, batches, [1, 5, 25], iters)
    if "e2e" not in skip:
        report["end_to_end_c1_graph"] = bench_end_to_end(args.size, graphs=True)
        report["end_to_end_c1_graph_async"] = bench_end_to_end(args.size, graphs=True, async_scheduling=True)
        if "e2e-eager" not in skip:
            report["end_to_end_c1_eager"] = bench_end_to_end(args.size, graphs=False)
    if "memory" not in skip:
        report["memory_seed_talker"] = memory_budget(args.size, 0.3, slots=10, max_len=4096)
    report["total_gib"] = torch.cuda.get_device_properties(0).total_memory / 2**30
    Path(args.out).write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
