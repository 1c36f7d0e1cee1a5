"""Times the reference ``moshi`` 0.2.13 per-frame loop on one GPU (the side-by-side baseline of
``personaplex_gpu.py``; the method of reference-gpu.md §1).

Runs in an environment where ``moshi`` is importable (carried as a wheel; never a voxstage dependency):

    python bench/families/personaplex/reference_moshi.py --out moshi.json [--batches 1,8,32,64] [--steps 100]

Size-true random weights (``loaders._lm_kwargs``, ``dep_q=8``, bf16; Mimi fp32, random codebooks). Timed,
with a host sync per call as moshi's server does (it reads the text token every step):
``LMGen.step`` (sampling: temp 0.8 / top-k 250 audio, 0.7 / 25 text), Mimi streaming encode and decode of
one frame, and the server's whole frame at batch 1 (encode, step, decode, ``.item()``, ``.cpu()``).
moshi's own CUDA graphs are on, torch.compile as the environment says (``NO_TORCH_COMPILE``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch


def timed(fn: Callable[[], object], steps: int, warmup: int) -> dict[str, float]:
    t_first = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    first_ms = 1e3 * (time.perf_counter() - t_first)
    for _ in range(warmup - 1):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(1e3 * (time.perf_counter() - t0))
    times.sort()
    return {
        "median_ms": statistics.median(times),
        "p99_ms": times[min(len(times) - 1, round(0.99 * (len(times) - 1)))],
        "min_ms": times[0],
        "first_call_ms": first_ms,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--batches", default="1,8,32,64")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--warmup", type=int, default=20)
    args = parser.parse_args()
    import moshi
    from moshi.models import loaders
    from moshi.models.lm import LMGen, LMModel

    torch.manual_seed(0)
    dev = "cuda"
    lm = LMModel(device=dev, dtype=torch.bfloat16, **loaders._lm_kwargs).eval()
    mimi = loaders.get_mimi(None, device=dev, num_codebooks=8)
    with torch.no_grad():
        for name, buf in mimi.named_buffers():
            if name.endswith("embedding_sum"):
                buf.normal_()
            elif name.endswith("cluster_usage"):
                buf.fill_(1.0)
    result: dict[str, object] = {
        "moshi": moshi.__version__,
        "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name(),
        "compile": os.environ.get("NO_TORCH_COMPILE") != "1",
        "params": sum(p.numel() for p in lm.parameters()),
        "lm_step": {},
        "mimi": {},
    }
    for b in [int(x) for x in args.batches.split(",")]:
        gen = LMGen(lm, temp=0.8, temp_text=0.7, top_k=250, top_k_text=25)
        user = torch.randint(0, 2048, (b, 8, 1), device=dev)
        pcm = torch.randn(b, 1, 1920, device=dev) * 0.1
        codes = torch.randint(0, 2048, (b, 8, 1), device=dev)
        torch.cuda.reset_peak_memory_stats()
        with torch.no_grad(), gen.streaming(b):

            def step(gen: LMGen = gen, user: torch.Tensor = user) -> None:
                out = gen.step(user)
                if out is not None:
                    out[:, 0, 0].cpu()

            stats = timed(step, args.steps, args.warmup)
        stats["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
        result["lm_step"][str(b)] = stats  # type: ignore[index]
        with torch.no_grad(), mimi.streaming(b):
            enc = timed(lambda: mimi.encode(pcm).cpu(), args.steps, args.warmup)  # noqa: B023
        with torch.no_grad(), mimi.streaming(b):
            dec = timed(lambda: mimi.decode(codes).cpu(), args.steps, args.warmup)  # noqa: B023
        result["mimi"][str(b)] = {"encode": enc, "decode": dec}  # type: ignore[index]
        del gen
        print(b, result["lm_step"][str(b)], flush=True)  # type: ignore[index]
    gen = LMGen(lm, temp=0.8, temp_text=0.7, top_k=250, top_k_text=25)
    pcm = torch.randn(1, 1, 1920, device=dev) * 0.1
    with torch.no_grad(), gen.streaming(1), mimi.streaming(1):

        def frame() -> None:
            user_codes = mimi.encode(pcm)
            out = gen.step(user_codes)
            if out is not None:
                out[:, 0, 0].item()
                mimi.decode(out[:, 1:]).cpu()

        result["full_frame_b1"] = timed(frame, args.steps, args.warmup)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result["full_frame_b1"]))


if __name__ == "__main__":
    main()
