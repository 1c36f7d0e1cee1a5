"""Per-call kernel statistics from a ``torch.profiler`` run (a family's profile script, e.g.
``bench/families/<family>/profile_gpu.py``): count, busy time, kernel families (name prefixes, as in the
profiles under ``../shared/reference/``) and coarse classes; and the printed summary of the script's records
(a table beside a "before" profile, the fastest setting per call shape)."""

from __future__ import annotations

import functools
import re
from collections import Counter
from collections.abc import Callable
from typing import Any

import torch

Record = dict[str, Any]

# Coarse classes, first match wins: attention and conv come before GEMM because their kernels' names also
# say "fprop" / "gemm" (cuDNN's SDPA flash kernel, ``implicit_convolve_sgemm``).
CLASSES = [
    ("sort", r"RadixSort|radix_sort|cub::"),
    ("attention", r"sdpa|flash|fmha|attention"),
    ("conv", r"convolve|conv|fprop|dgrad|wgrad"),
    ("gemm", r"nvjet|gemm|cutlass|splitKreduce|cublas"),
    ("transpose", r"nchwToNhwc|nhwcToNchw|transpose"),
    ("triton", r"^[a-z][a-z0-9_]*_kernel$"),  # a Triton kernel is named after its Python function
    ("reduce", r"reduce_kernel|softmax|norm_kernel"),
    ("elementwise", r"elementwise|CatArray|index|scatter"),
]

SLOW_CONV = "implicit_convolve_sgemm"  # the cuDNN fallback the "before" profile found (17.8 ms in one launch)


@functools.cache
def family(name: str) -> str:
    """A kernel name's family: the name without ``void``, template arguments and parameters."""
    n = name.removeprefix("void ").replace("(anonymous namespace)", "anon")
    return re.split(r"[<(]", n, maxsplit=1)[0].strip()[:80] or name[:80]


@functools.cache
def kernel_class(name: str) -> str:
    return next((c for c, pattern in CLASSES if re.search(pattern, name)), "other")


def raw_events(prof: Any) -> list[tuple[str, Any, int, int]]:
    """``(name, device type, start ns, end ns)`` of a finished ``torch.profiler.profile``, read from its
    kineto result: building ``prof.events()`` (FunctionEvents and their trees) costs about a second per
    10k events, longer than the calls it describes."""
    try:
        found = [
            (e.name(), e.device_type(), e.start_ns(), e.end_ns())
            for e in prof.profiler.kineto_results.events()
        ]
    except AttributeError:  # another torch: the public (slower) way
        found = [
            (e.name, e.device_type, 1000 * e.time_range.start, 1000 * e.time_range.end) for e in prof.events()
        ]
    return [f for f in found if not f[0].startswith(("[memory]", "profiler::", "[OutOfMemory]"))]


def kernels_of(prof: Any, cuda: bool) -> tuple[list[tuple[str, float]], int]:
    """``(name, µs)`` per kernel and the number of memcpy / memset activities (counted apart: the
    reference's "kernels per call" are kernels only). On CPU (the smoke run, one thread) leaf ops stand in
    for kernels and their time for device time: an op is a leaf when the next op starts after it ends."""
    kernels: list[tuple[str, float]] = []
    copies = 0
    for name, start, end in leaves(raw_events(prof), cuda):
        if cuda and name.startswith(("Memcpy", "Memset")):
            copies += 1
        else:
            kernels.append((name, (end - start) / 1e3))
    return kernels, copies


def leaves(events: list[tuple[str, Any, int, int]], cuda: bool) -> list[tuple[str, int, int]]:
    """``(name, start, end)`` of the device's activities in ``events`` (``raw_events``), in time order; on
    CPU the leaf ops only (an op is a leaf when the next op starts after it ends)."""
    device = torch.autograd.DeviceType.CUDA if cuda else torch.autograd.DeviceType.CPU
    work = sorted((e for e in events if e[1] == device), key=lambda e: (e[2], -e[3]))
    return [
        (name, start, end)
        for i, (name, _, start, end) in enumerate(work)
        if cuda or i + 1 == len(work) or work[i + 1][2] >= end
    ]


def summarize(prof: Any, calls: int, cuda: bool, top: int = 12) -> dict[str, Any]:
    """Per-call kernel count, busy ms, the ``top`` families by time, classes and the slow conv's share, from
    a profile of ``calls`` calls."""
    kernels, copies = kernels_of(prof, cuda)
    fams: dict[str, list[float]] = {}
    classes: dict[str, list[float]] = {}
    slow = [0.0, 0.0]
    for name, us in kernels:
        for table, key in ((fams, family(name)), (classes, kernel_class(name))):
            acc = table.setdefault(key, [0.0, 0.0])
            acc[0], acc[1] = acc[0] + 1, acc[1] + us
        if SLOW_CONV in name:
            slow = [slow[0] + 1, slow[1] + us]

    def per_call(acc: list[float]) -> dict[str, float]:
        return {"count": round(acc[0] / calls, 1), "ms": round(acc[1] / calls / 1e3, 4)}

    by_time = sorted(fams.items(), key=lambda kv: -kv[1][1])[:top]
    return {
        "kernels_per_call": round(len(kernels) / calls, 1),
        "gpu_busy_ms": round(sum(us for _, us in kernels) / calls / 1e3, 4),
        "copies_per_call": round(copies / calls, 1),
        "top_families": [{"family": f, **per_call(acc)} for f, acc in by_time],
        "classes": {c: per_call(acc) for c, acc in sorted(classes.items(), key=lambda kv: -kv[1][1])},
        "slow_conv": per_call(slow),
    }


# -- the printed report -----------------------------------------------------------------------------------
# A "before" profile: (part, batch, frames) -> (kernels, GPU-busy ms) per call, of one preset size.
Before = tuple[str, dict[tuple[str, int, int], tuple[int, float]]]


def table(records: list[Record], before: Before | None = None) -> str:
    """One row per record; ``before`` (the size it was taken at, its rows) printed beside matching rows."""
    head = f"{'part':7}{'size':6}{'B':>4}{'T':>4} {'fused':6}{'sampler':8}{'dtype':6}{'cudnn':6}"
    head += f"{'kernels':>9}{'busy ms':>10}{'wall ms':>10}{'capt s':>8}  before (kernels, busy ms)"
    lines = [head]
    for r in records:
        lv = r.get("levers", {})
        cells = f"{r.get('part', ''):7}{r.get('size', ''):6}{r.get('batch', ''):>4}{r.get('frames', ''):>4} "
        cells += f"{str(lv.get('fused', '')):6}{str(lv.get('sampler') or '-'):8}{str(lv.get('dtype', '')):6}"
        cells += f"{str(lv.get('cudnn_benchmark', '-')):6}"
        if "error" in r:
            lines.append(f"{cells}  ERROR {r['error'][:70]}")
            continue
        key = (r["part"], r["batch"], r["frames"])
        was = before[1].get(key) if before and r["size"] == before[0] else None
        cells += f"{r['kernels_per_call']:>9}{r['gpu_busy_ms']:>10.3f}{r['wall_ms_p50']:>10.3f}"
        cells += f"{r['capture_s']:>8.2f}"
        lines.append(cells + (f"  {was}" if was else ""))
    return "\n".join(lines)


def wins(records: list[Record], triton: bool) -> str:
    """Per (part, size, batch, frames): the fastest setting by wall ms against the baseline setting (each
    lever at its first value: fused on, top_k, bf16, cudnn.benchmark off)."""
    groups: dict[tuple[Any, ...], list[Record]] = {}
    for r in records:
        if "error" not in r:
            groups.setdefault((r["part"], r["size"], r["batch"], r["frames"]), []).append(r)
    base_levers = {"fused": triton, "sampler": "top_k", "dtype": "bf16"}
    lines = []
    for key, rows in groups.items():
        best = min(rows, key=lambda r: r["wall_ms_p50"])
        base = [r for r in rows if all(r["levers"].get(k) in (v, None) for k, v in base_levers.items())]
        base = [r for r in base if not r["levers"].get("cudnn_benchmark")]
        ref = f", baseline {base[0]['wall_ms_p50']:.3f} ms" if base else ""
        lines.append(f"{' '.join(map(str, key))}: best {best['levers']} {best['wall_ms_p50']:.3f} ms{ref}")
    return "\n".join(lines)


def profile_call(fn: Callable[[], object], device: str, top: int = 15, host: bool = False) -> dict[str, Any]:
    """Top ops of one call of ``fn`` (after one unprofiled call) by device time (``host``: by their own host
    time, where launch-bound Python work shows), and how many host-to-device copies, synchronizations and
    allocations it made: what a benchmark prints beside its timings."""
    acts = [torch.profiler.ProfilerActivity.CPU]
    if device == "cuda":
        acts.append(torch.profiler.ProfilerActivity.CUDA)

    def sync() -> None:
        if device == "cuda":
            torch.cuda.synchronize()

    fn()
    sync()
    with torch.profiler.profile(activities=acts) as prof:
        fn()
        sync()
    events = prof.key_averages()
    runtime: Counter[str] = Counter()
    for e in events:
        if e.key.startswith(("cudaMemcpy", "cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaMalloc")):
            runtime[e.key] += e.count
    # Device time on a GPU; on the CPU (smoke runs) the ops' own host time.
    attr = "device_time_total" if device == "cuda" and not host else "self_cpu_time_total"
    ranked = sorted(events, key=lambda e: getattr(e, attr, 0.0), reverse=True)[:top]
    return {
        "runtime_calls": dict(runtime),
        "top_ops": [
            {"name": e.key[:100], "count": e.count, "ms": getattr(e, attr, 0.0) / 1e3} for e in ranked
        ],
        "ops_timed_by": attr,
    }


PHASE = "phase:"


def phase(name: str) -> Any:
    """A profiler range that ``phase_stats`` reads: wrap each part of a call in one, and synchronize the
    device before it closes, so every kernel the part launched runs inside it."""
    return torch.profiler.record_function(PHASE + name)


def phase_stats(prof: Any, cuda: bool, top: int = 5) -> dict[str, dict[str, Any]]:
    """Per ``phase`` name of a finished profile: its ranges' wall ms, and the kernels (leaf ops on CPU)
    that started inside them: count, busy ms, the ``top`` families by time. Parts that synchronize at their
    end own exactly their device work, so two calls' phases compare kernel for kernel."""
    events = raw_events(prof)
    ranges: dict[str, list[tuple[int, int]]] = {}
    for name, _, start, end in events:
        if name.startswith(PHASE):
            ranges.setdefault(name.removeprefix(PHASE), []).append((start, end))
    work = leaves([e for e in events if not e[0].startswith(PHASE)], cuda)
    out: dict[str, dict[str, Any]] = {}
    for name, spans in ranges.items():
        inside = [k for k in work if any(s <= k[1] < e for s, e in spans)]
        fams: Counter[str] = Counter()
        for kname, start, end in inside:
            fams[family(kname)] += end - start
        out[name] = {
            "ranges": len(spans),
            "wall_ms": round(sum(e - s for s, e in spans) / 1e6, 4),
            "kernels": len(inside),
            "busy_ms": round(sum(end - start for _, start, end in inside) / 1e6, 4),
            "top": [{"family": f, "ms": round(ns / 1e6, 4)} for f, ns in fams.most_common(top)],
        }
    return out
