"""Kernels per call, GPU-busy ms per call and wall ms per call of the Qwen3-TTS frame step and codec decode,
for each issue-14 lever (issue 14, acceptance 1: the profile summary before and after; "measure each lever,
keep what wins").

Setup as in ``../shared/reference/qwen3-profile.md`` (the "before" profile), so the numbers compare:
size-true random weights; the talker in bf16 with CUDA graphs, every slot decoding at one context bucket
(256); the codec's ``GraphedDecode`` with frame buckets [1, 25]; kernels from ``torch.profiler`` (CUDA
activity) over ``--calls`` calls after warm-up, divided per call. Wall ms is host-observed and synchronized
(median over up to ``--iters`` calls).

Levers (``--levers``; one not listed is held at its baseline, the first value):
* ``fused``: Triton kernels on / off (``voxstage.nn.fused.set_triton``, set before each capture);
* ``sampler``: the talker's sampling variant: top_k (the deploy default) / full (sorted top-k, top-p) /
  greedy;
* ``dtype``: the codec in bf16 / fp32;
* ``cudnn``: ``torch.backends.cudnn.benchmark`` off / on for the codec. cuDNN caches a plan per shape for
  the life of the process whatever the flag was, so "on" runs in a child process of this script.

Usage: ``python -m bench.families.qwen3_tts.profile_gpu --out prof.json [--size 0.6b|1.7b] [--quick]
[--parts talker,codec] [--levers fused,sampler,dtype,cudnn]``; ``--device cpu`` is a smoke run on the tiny
preset (CPU profiler activity: leaf ops stand in for kernels). Writes a JSON list of records (after every
record, so a crash keeps what was measured) and prints a table.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from services.codec.graphs import GraphedDecode
from services.codec.models.qwen3_tts.loader import random_init as random_decoder
from services.codec.models.qwen3_tts.presets import decoder_preset
from services.codec.models.qwen3_tts.streaming import StreamingDecoder
from services.talker.launch import bucket
from services.talker.models import load_talker
from services.talker.sampling import Sampler, SamplingParams
from voxstage.nn import fused
from voxstage.presets import resolve_model

try:
    from bench.families.qwen3_tts.engine_gpu import SAMPLING, admit_prompts
    from bench.kernel_stats import Before, summarize, table, wins
except ModuleNotFoundError:  # run as a file: this folder is on sys.path, the repository root is not
    sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
    from bench.families.qwen3_tts.engine_gpu import SAMPLING, admit_prompts
    from bench.kernel_stats import Before, summarize, table, wins

Record = dict[str, Any]
# ``../shared/reference/qwen3-profile.md`` (0.6B, 2026-12-01): (kernels, GPU-busy ms) per call, printed next
# to this run's rows.
BEFORE: Before = (
    "0.6b",
    {("talker", 1, 1): (3479, 9.07), ("talker", 64, 1): (3685, 12.49),
     ("codec", 1, 1): (1083, 2.61), ("codec", 64, 25): (1128, 152.5)},
)  # fmt: skip

LEVERS = {"fused": [True, False], "sampler": ["top_k", "full", "greedy"], "dtype": ["bf16", "fp32"],
          "cudnn": [False, True]}  # fmt: skip
SAMPLERS = {
    "top_k": SAMPLING,  # engine_gpu.py's and the deploy file's settings: Sampler.TOP_K
    "full": SamplingParams(do_sample=True, temperature=0.9, top_k=50, top_p=0.95, repetition_penalty=1.05),
    "greedy": SamplingParams(do_sample=False, repetition_penalty=1.05),
}
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


@dataclass
class Run:
    cuda: bool
    size: str
    iters: int  # most wall-timed calls per setting
    calls: int  # profiled calls per setting
    warmup: int
    budget_s: float  # wall timing stops early past this (a 64x25 decode is 150 ms)

    @property
    def device(self) -> str:
        return "cuda" if self.cuda else "cpu"

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()


def measure(run: Run, fn: Callable[[], object], iters: int, graphs: Any = None) -> Record:
    """Warm-up, synchronized wall time per call (median of up to ``iters``), then ``run.calls`` profiled.
    ``graphs`` (the ``GraphCache`` that ``fn`` replays from) is the fallback when the profiler sees no kernel
    in the replays (CUPTI attached after capture on some stacks): the same calls eager launch the same
    kernels, so their count still holds (their busy time is close, without the replay's launch savings)."""
    from torch.profiler import ProfilerActivity, profile

    def timed() -> float:
        t0 = time.perf_counter()
        fn()
        run.sync()
        return 1e3 * (time.perf_counter() - t0)

    def profiled() -> Record:
        with profile(activities=[ProfilerActivity.CUDA if run.cuda else ProfilerActivity.CPU]) as prof:
            for _ in range(run.calls):
                fn()
            run.sync()
        return summarize(prof, run.calls, run.cuda)

    for _ in range(run.warmup):
        fn()
    run.sync()
    times = [timed()]
    n = min(iters, max(5, int(1e3 * run.budget_s / max(times[0], 1e-3))))
    times += [timed() for _ in range(n - 1)]
    out = {"wall_ms_p50": round(statistics.median(times), 4), "wall_ms_min": round(min(times), 4)}
    stats = profiled()
    out |= {"wall_iters": len(times), "profiled": "graph replay" if run.cuda else "eager (cpu)"}
    if run.cuda and stats["kernels_per_call"] == 0 and graphs is not None:
        graphs.enabled = False  # GraphCache.run then calls the captured function itself
        try:
            stats = profiled()
        finally:
            graphs.enabled = True
        out["profiled"] = "eager: the profiler saw no kernel in the graph replays (try --cupti-warmup)"
    return out | stats


def failed(rec: Record, exc: BaseException) -> Record:
    tb = traceback.format_exception(exc)
    return rec | {"error": f"{type(exc).__name__}: {exc}", "traceback": "".join(tb)[-2000:]}


def fused_values(levers: set[str]) -> list[bool]:
    if not fused.triton_available():
        return [False]  # no Triton (CPU torch): only the PyTorch path exists, measured once
    return LEVERS["fused"] if "fused" in levers else [True]


def release() -> None:
    """Give cached device memory back between settings (graph pools, the other dtype's model)."""
    if torch.cuda.is_available():
        gc.collect()
        torch.cuda.empty_cache()


# -- talker frame step -------------------------------------------------------------------------------------
def arm_slots(adapter: Any, chunks: list[Any], b: int, params: SamplingParams) -> None:
    """Re-admit slots ``[0, b)`` with ``params``: fresh frame state and sampling rows, the position back at
    the prompt's end. The K/V of the one prefill stays valid (same prompt), so no prefill runs per setting."""
    for slot, prepared, _, _ in chunks[:b]:
        adapter.admit(slot, prepared, seed=slot, sampling=params, subtalker=params, min_frames=2)
        adapter.append_text(slot, 0, list(prepared.trailing_ids), True)
        adapter.start_decode(slot, prepared)


def talker_setting(run: Run, adapter: Any, chunks: list[Any], b: int, ctx: int, sampler: str) -> Record:
    arm_slots(adapter, chunks, b, SAMPLERS[sampler])
    active = [True] * b
    variant = adapter.variant(active)
    if variant != (int(Sampler[sampler.upper()]), 0):  # (sampler, head_only): a whole step
        raise RuntimeError(f"slots armed for {sampler} decode as variant {variant}")
    # Every call advances each slot by one position; all of them must stay inside the context bucket.
    room = ctx - 1 - max(c[1].length for c in chunks[:b]) - run.warmup - 2 * run.calls  # 2: eager fallback
    if room < 1:
        raise ValueError(f"prompt + calls exceed the context bucket {ctx}: raise --ctx or lower --iters")
    key = (bucket(b, adapter.num_slots), bucket(ctx, adapter.max_len, adapter.min_attn_bucket), *variant)
    t0 = time.perf_counter()
    adapter.graphs.capture(*key)  # only this bucket, not the engine's whole ladder
    run.sync()
    capture_s = time.perf_counter() - t0
    return {
        "capture_s": round(capture_s, 3),
        **measure(run, lambda: adapter.decode(active, ctx), min(run.iters, room), adapter.graphs),
    }


def run_talker(run: Run, args: argparse.Namespace, levers: set[str], emit: Callable[[Record], None]) -> None:
    batches, ctx = [int(x) for x in args.batches.split(",")], args.ctx
    fuse_values = fused_values(levers)
    samplers = LEVERS["sampler"] if "sampler" in levers else LEVERS["sampler"][:1]
    base: Record = {"part": "talker", "size": run.size, "frames": 1, "ctx": ctx}
    try:
        t0 = time.perf_counter()
        adapter, _ = load_talker(
            resolve_model(f"qwen3-tts-{run.size}"), device=run.device, dtype=torch.bfloat16
        )
        adapter.allocate(max(batches), max(1024, 2 * ctx))
        chunks = admit_prompts(adapter, max(batches))
        for i in range(0, len(chunks), 8):  # eager prefill, 8 prompts a call, once for every setting
            adapter.prefill_many(chunks[i : i + 8])
        run.sync()
        print(f"talker {run.size}: built and prefilled in {time.perf_counter() - t0:.1f} s", flush=True)
    except Exception as exc:  # recorded, the codec part still runs
        emit(failed(base | {"stage": "build"}, exc))
        return
    for fuse in fuse_values:
        previous = fused.set_triton(fuse)
        try:
            for b in batches:
                for sampler in samplers:
                    levs = {"fused": fuse, "sampler": sampler, "dtype": "bf16", "cudnn_benchmark": None}
                    rec = base | {"batch": b, "levers": levs}
                    try:
                        if adapter.graphs is None:  # a fresh cache per fused setting: graphs keep their path
                            adapter.enable_cuda_graphs()
                        rec |= talker_setting(run, adapter, chunks, b, ctx, sampler)
                    except Exception as exc:  # one failed setting must not lose the run
                        rec = failed(rec, exc)
                    emit(rec)
        finally:
            fused.set_triton(previous)
            adapter.graphs = None
            release()
    del adapter, chunks
    release()


# -- codec decode ------------------------------------------------------------------------------------------
def codec_setting(run: Run, pool: Any, graphed: GraphedDecode, b: int, t: int) -> Record:
    if t not in graphed.frame_buckets or b > graphed.max_batch:
        raise ValueError(
            f"{b}x{t} is outside the graphed buckets {graphed.frame_buckets} (max {graphed.max_batch})"
        )
    gen = torch.Generator(device=run.device).manual_seed(0)
    codes = torch.randint(0, 2048, (b, 16, t), device=run.device, generator=gen)
    slots, lengths = torch.arange(b, device=run.device), torch.full((b,), t, device=run.device)
    pool.reset(slots)
    t0 = time.perf_counter()
    graphed.graphs.capture(b, t)  # with cudnn.benchmark the warm-up runs time every conv algorithm here
    run.sync()
    capture_s = time.perf_counter() - t0
    return {
        "capture_s": round(capture_s, 3),
        **measure(run, lambda: graphed(codes, slots, lengths), run.iters, graphed.graphs),
    }


def run_codec(run: Run, args: argparse.Namespace, levers: set[str], emit: Callable[[Record], None]) -> None:
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.codec_shapes.split(",")]
    buckets = [int(x) for x in args.frame_buckets.split(",")]
    max_b = max(b for b, _ in shapes)
    fuse_values = fused_values(levers)
    dtypes = LEVERS["dtype"] if "dtype" in levers else LEVERS["dtype"][:1]
    cudnn = bool(torch.backends.cudnn.benchmark) if run.cuda else None
    for dtype in dtypes:
        base: Record = {"part": "codec", "size": run.size, "ctx": None}
        try:
            # Built outside inference mode, as the stage loads it: the decoder keeps tables computed from its
            # weights (the quantizer's codebooks, SnakeBeta's scales) only for weights with a version counter.
            with torch.inference_mode(False):
                model = random_decoder(
                    decoder_preset(f"qwen3-tts-{run.size}"), 0, device=run.device, dtype=DTYPES[dtype]
                )
            pool = StreamingDecoder(model, 2 * max_b)  # the upper half: GraphedDecode's scratch slots
        except Exception as exc:
            emit(failed(base | {"stage": "build", "levers": {"dtype": dtype}}, exc))
            continue
        for fuse in fuse_values:
            previous = fused.set_triton(fuse)
            graphed: GraphedDecode | None = None
            try:
                for b, t in shapes:
                    levs = {"fused": fuse, "sampler": None, "dtype": dtype, "cudnn_benchmark": cudnn}
                    rec = base | {"batch": b, "frames": t, "levers": levs}
                    try:
                        if graphed is None:  # per fused setting: its graphs capture that path
                            graphed = GraphedDecode(
                                pool, num_groups=16, max_batch=max_b, frame_buckets=buckets, device=run.device
                            )
                        rec |= codec_setting(run, pool, graphed, b, t)
                    except Exception as exc:
                        rec = failed(rec, exc)
                    emit(rec)
            finally:
                fused.set_triton(previous)
                del graphed
                release()
        del model, pool
        release()


def run_cudnn_child(args: argparse.Namespace, levers: set[str]) -> list[Record]:
    """The codec part again with ``cudnn.benchmark`` on, in a fresh process (fresh cuDNN plan caches)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "cudnn.json"
        cmd = [sys.executable, str(Path(__file__).resolve()), "--out", str(out), "--parts", "codec"]
        cmd += ["--levers", ",".join(sorted(levers - {"cudnn"})) or "none", "--cudnn-benchmark"]
        for flag in ("size", "device", "codec_shapes", "frame_buckets", "iters", "calls"):
            cmd += [f"--{flag.replace('_', '-')}", str(getattr(args, flag))]
        cmd += ["--quick"] * args.quick + ["--cupti-warmup"] * args.cupti_warmup
        print("cudnn.benchmark on, in a child:", " ".join(cmd[1:]), flush=True)
        try:
            code: object = subprocess.run(cmd, timeout=args.child_timeout).returncode
        except subprocess.TimeoutExpired:  # the child is killed; what it wrote so far is kept
            code = f"timeout after {args.child_timeout:.0f} s"
        records = json.loads(out.read_text()) if out.exists() else []
    error = {"part": "codec", "levers": {"cudnn_benchmark": True}, "error": f"child exited: {code}"}
    return records + ([error] if code != 0 else [])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--size", default="0.6b", choices=["0.6b", "1.7b"], help="ignored on cpu (tiny preset)")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--quick", action="store_true", help="fewer timed calls per setting")
    ap.add_argument("--parts", default="talker,codec")
    ap.add_argument(
        "--levers", default="fused,sampler,dtype,cudnn", help=f"any of {','.join(LEVERS)}, or none"
    )
    ap.add_argument("--batches", default=None, help="talker batches (default 1,64; cpu 1,2)")
    ap.add_argument("--ctx", type=int, default=256, help="talker context bucket")
    ap.add_argument("--codec-shapes", default=None, help="streams x frames (default 1x1,64x25; cpu 1x1,2x5)")
    ap.add_argument(
        "--frame-buckets", default=None, help="GraphedDecode frame buckets (default 1,25; cpu 1,5)"
    )
    ap.add_argument("--iters", type=int, default=None, help="most wall-timed calls per setting")
    ap.add_argument("--calls", type=int, default=None, help="profiled calls per setting (default 3)")
    ap.add_argument("--cupti-warmup", action="store_true", help="start CUPTI before any graph capture")
    ap.add_argument("--cudnn-benchmark", action="store_true", help="(the child's flag) cudnn.benchmark on")
    ap.add_argument("--child-timeout", type=float, default=420.0)
    args = ap.parse_args(argv)
    cpu = args.device == "cpu"
    args.batches = args.batches or ("1,2" if cpu else "1,64")
    args.codec_shapes = args.codec_shapes or ("1x1,2x5" if cpu else "1x1,64x25")
    args.frame_buckets = args.frame_buckets or ("1,5" if cpu else "1,25")
    args.iters = args.iters or (2 if cpu else 10 if args.quick else 30)
    args.calls = args.calls or (1 if cpu and args.quick else 3)
    levers = set() if args.levers == "none" else set(args.levers.split(","))
    if levers - set(LEVERS):
        ap.error(f"unknown levers {sorted(levers - set(LEVERS))}")
    size = "tiny" if cpu else args.size
    run = Run(cuda=not cpu, size=size, iters=args.iters, calls=args.calls, warmup=1 if cpu else 3,
              budget_s=1.0 if args.quick else 2.0)  # fmt: skip
    env = {"device_name": "cpu" if cpu else torch.cuda.get_device_name(), "torch": torch.__version__,
           "triton": fused.triton_available(), "activity": "cpu" if cpu else "cuda"}  # fmt: skip
    if cpu:
        torch.set_num_threads(1)
    else:
        torch.backends.cuda.matmul.allow_tf32 = True  # as engine_gpu.py
        torch.backends.cudnn.benchmark = args.cudnn_benchmark  # before any capture: plans are cached
        if args.cupti_warmup:
            from torch.profiler import _utils

            _utils._init_for_cuda_graphs()
    records: list[Record] = []
    out = Path(args.out)

    def emit(rec: Record) -> None:
        records.append(env | rec)
        out.write_text(json.dumps(records, indent=1) + "\n")
        brief = {k: rec.get(k) for k in ("batch", "frames", "kernels_per_call", "gpu_busy_ms", "wall_ms_p50")}
        print(rec["part"], rec.get("levers"), rec.get("error") or brief, flush=True)

    started = time.perf_counter()
    parts = set(args.parts.split(","))
    for part, fn in (("talker", run_talker), ("codec", run_codec)):
        if part in parts:
            try:
                with torch.inference_mode():
                    fn(run, args, levers, emit)
            except Exception as exc:  # a bug outside the per-setting guards: the other part still runs
                emit(failed({"part": part, "size": size, "stage": "driver"}, exc))
    if "codec" in parts and "cudnn" in levers and run.cuda and not args.cudnn_benchmark:
        try:
            records.extend(run_cudnn_child(args, levers))
        except Exception as exc:
            records.append(failed({"part": "codec", "levers": {"cudnn_benchmark": True}}, exc))
        out.write_text(json.dumps(records, indent=1) + "\n")
    print(table(records, BEFORE), flush=True)
    print(wins(records, fused.triton_available()), flush=True)
    print(f"{len(records)} records in {time.perf_counter() - started:.0f} s -> {out}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
