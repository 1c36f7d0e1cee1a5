"""Audio8-TTS engine micro-benchmarks on one GPU (issue 13): the talker's frame step and the codec's decode.

With the size-true ``audio8-tts-0.6b`` random-weight preset:

* ``talker_frame_step``: one engine tick of ``Audio8TTSAdapter`` (slow AR step, compact 4097-row head,
  semantic draw with RAS, 9 fast-AR steps with their draws), CUDA-graphed as the stage runs it, bf16, at each
  batch size, with the released sampling (0.7 / 50 / 0.9); plus graph = eager agreement of the sampled codes;
* ``codec``: the streaming decode through the engine's ``GraphedDecode`` at (batch, chunk) buckets, fp32 (the
  default) and bf16, in audio-seconds per GPU-second, plus the bf16 error against fp32 on the same codes and
  the cost of one overlap+crop chunk (25 new frames behind 25 of context) against a stateful one;
* ``work_ratio``: codec GPU-seconds per talker GPU-second for the same audio at batch 64, which says which
  stage bounds capacity on a shared GPU.

    python bench/families/audio8_tts/audio8_gpu.py --out a8.json [--batches 1,8,32,64] \
        [--device cpu --size audio8-tts-tiny]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from services.codec.graphs import GraphedDecode
from services.codec.models.audio8_tts.loader import random_init as random_codec
from services.codec.models.audio8_tts.presets import codec_preset
from services.codec.models.audio8_tts.streaming import Audio8StreamingDecoder
from services.talker.models import load_talker
from services.talker.sampling import SamplingParams
from services.talker.spec import SpeechSpec
from voxstage.presets import resolve_model

RATE, SPF = 44_100, 2048
SAMPLING = SamplingParams(temperature=0.7, top_k=50, top_p=0.9)
TEXT = "The quick brown fox jumps over the lazy dog while the orchestra tunes up for the evening."


def timed(fn: Callable[[], object], device: str, iters: int, warmup: int = 3) -> dict[str, float]:
    """Host-observed time per call with a sync after each (median and p99, ms)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(1e3 * (time.perf_counter() - t0))
    times.sort()
    return {"median_ms": statistics.median(times), "p99_ms": times[round(0.99 * (len(times) - 1))]}


def _admit(adapter: Any, batch: int) -> None:
    for slot in range(batch):
        prepared = adapter.prepare(SpeechSpec(text=f"{TEXT} {slot}"))
        adapter.admit(slot, prepared, seed=slot, sampling=SAMPLING, subtalker=SAMPLING, min_frames=10_000)
        adapter.prefill_many([(slot, prepared, 0, prepared.length - 1)])
        adapter.start_decode(slot, prepared)


def bench_talker(size: str, device: str, batches: list[int], iters: int) -> dict[str, Any]:
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    source = resolve_model(size)
    out: dict[str, Any] = {"dtype": str(dtype).removeprefix("torch.")}
    adapter, _ = load_talker(source, device=device, dtype=dtype)
    adapter.allocate(max(batches), 512)
    if device == "cuda":
        adapter.enable_cuda_graphs()
    rows = {}
    for b in batches:
        _admit(adapter, b)
        active = [True] * b
        r = timed(lambda a=active: adapter.decode(a, 256), device, iters)
        r["audio_s_per_gpu_s"] = b * SPF / RATE / (r["median_ms"] / 1e3)
        rows[str(b)] = r
    out["graphed" if device == "cuda" else "eager"] = rows
    codes = {}
    for mode in ("eager", "graph"):  # the captured frame draws the same codes as the eager one
        a, _ = load_talker(source, device=device, dtype=dtype)
        a.allocate(4, 256)
        if mode == "graph" and device == "cuda":
            a.enable_cuda_graphs()
        _admit(a, 3)
        codes[mode] = np.stack([a.decode([True] * 3, 128)[0] for _ in range(12)])
        del a
    out["graph_matches_eager"] = bool(np.array_equal(codes["eager"], codes["graph"]))
    return out


def _codec_rows(cfg: Any, dtype: torch.dtype, device: str, batches: list[int], iters: int) -> dict[str, Any]:
    model = random_codec(cfg, 0, device=device, dtype=dtype)
    max_b = max(batches)
    pool = Audio8StreamingDecoder(model, 2 * max_b)
    graphed = GraphedDecode(
        pool, num_groups=10, max_batch=max_b, frame_buckets=(1, 4, 25, 50), device=device,
        enabled=device == "cuda",
    )  # fmt: skip
    gen = torch.Generator(device=device).manual_seed(1)
    rows: dict[str, Any] = {}

    def point(b: int, t: int, new: int, reset: bool) -> dict[str, float]:
        codes = torch.randint(0, 4096, (b, 10, t), device=device, generator=gen)
        slots, lengths = torch.arange(b, device=device), torch.full((b,), t, device=device)

        def call() -> None:
            if reset:  # overlap+crop: every chunk starts from a fresh state
                pool.reset(slots)
            graphed(codes, slots, lengths)

        r = timed(call, device, iters)
        r["audio_s_per_gpu_s"] = b * new * SPF / RATE / (r["median_ms"] / 1e3)
        return r

    for b in batches:
        for t in (1, 4, 25):
            rows[f"b{b}_t{t}"] = point(b, t, t, reset=False)
    # Overlap+crop decodes 25 frames of context again with every steady chunk: a 50-frame window, 25 new.
    rows[f"b{max_b}_t25_overlap_crop_25"] = point(max_b, 50, 25, reset=True)
    same = torch.Generator(device).manual_seed(0)  # the same probe codes for both dtypes
    probe = torch.randint(0, 4096, (4, 10, 25), device=device, generator=same)
    slots4 = torch.arange(4, device=device)
    pool.reset(slots4)
    rows["probe_wave"] = pool.decode(probe, slots4, torch.full((4,), 25, device=device)).float()
    return rows


def bench_codec(size: str, device: str, batches: list[int], iters: int) -> dict[str, Any]:
    cfg = codec_preset(size)
    out: dict[str, Any] = {}
    waves = {}
    for dtype in (torch.float32, torch.bfloat16):
        name = str(dtype).removeprefix("torch.")
        rows = _codec_rows(cfg, dtype, device, batches, iters)
        waves[name] = rows.pop("probe_wave")
        out[name] = rows
        if device == "cuda":
            torch.cuda.empty_cache()
    diff = waves["bfloat16"] - waves["float32"]
    out["bf16_vs_fp32"] = {
        "max_abs": float(diff.abs().max()),
        "rel_rms": float(diff.pow(2).mean().sqrt() / waves["float32"].pow(2).mean().sqrt()),
    }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--size", default="audio8-tts-0.6b", help="preset name (audio8-tts-tiny on CPU)")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--batches", default="1,8,32,64")
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--quick", action="store_true", help="20 iterations per point (run_gpu's quick profile)")
    args = ap.parse_args()
    if args.device == "cpu":
        torch.set_num_threads(1)
    else:
        torch.backends.cudnn.benchmark = True
    iters = 20 if args.quick else args.iters
    batches = [int(b) for b in args.batches.split(",")]
    report: dict[str, Any] = {
        "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
        "torch": torch.__version__,
        "size": args.size,
        "date": time.strftime("%Y-%m-%d"),
        "batches": batches,
    }
    report["talker_frame_step"] = bench_talker(args.size, args.device, batches, iters)
    report["codec"] = bench_codec(args.size, args.device, batches, iters)
    top = str(max(batches))
    talker_ms = report["talker_frame_step"].get("graphed", report["talker_frame_step"].get("eager"))[top]
    codec_row = report["codec"]["float32"][f"b{top}_t25"]
    # GPU time per audio second: the codec's at steady 25-frame chunks against the talker's frame step.
    report["work_ratio_codec_over_talker"] = talker_ms["audio_s_per_gpu_s"] / codec_row["audio_s_per_gpu_s"]
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
