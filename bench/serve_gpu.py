"""The serving phases of ``bench/run_gpu.py``: one ``voxstage serve`` stack per model (and pair count), then
warm-up, ``latency``, ``poisson``, ``closed``, ``openai`` and the LLM-rate phases ``llm`` / ``llm_poisson``
against it.

``openai`` measures the HTTP face as users meet it (issue 29): the official ``openai`` client
(bench/openai_client.py) on kept-alive connections, each response read to its end, at c=1
(``c1_openai_<tag>.json``, as many requests as ``c1``) and in a closed search
(``closed_search_openai_<tag>.json``, the same levels and gate as ``closed``).

``llm`` runs the same measurements as the whole-text phases with ``--text-mode llm`` (bench/llm_stream.py):
TTFA at 1 req/s Poisson, c=1, and the closed-loop search (from ``Profile.llm_conc_start`` streams up to
``--llm-search-max``); ``llm_poisson`` adds the Poisson search. Output files carry ``_llm`` before the tag:
``ttfa_1rps_llm_<tag>.json``, ``c1_llm_<tag>.json``, ``closed_search_llm_<tag>.json``,
``poisson_search_llm_<tag>.json``.

``--pairs N`` (N > 1) starts N talker and N codec replicas sharing the one GPU (bench/stack.py splits the
slots and the memory between them) and tags every file ``<size>_<N>pairs``, so one output dir holds the
one-pair and the N-pair runs side by side.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

from bench import loadgen
from bench.procsample import format_groups
from bench.prom import format_urls
from bench.stack import Stack, StackSpec

if TYPE_CHECKING:
    from bench.run_gpu import Family, Profile

SERVE_PHASES = ("latency", "poisson", "closed", "openai", "llm", "llm_poisson")


def run_loadgen(out: Path, name: str, args: list[str], log: list[dict]) -> dict:
    """One loadgen invocation, in-process, recorded with the equivalent command line."""
    path = out / f"{name}.json"
    argv = [*args, "--out", str(path)]
    print(f"\n== {name}: python -m bench.loadgen {' '.join(argv)}", flush=True)
    t0 = time.monotonic()
    loadgen.main(argv)
    log.append({"phase": name, "argv": argv, "wall_s": time.monotonic() - t0})
    return json.loads(path.read_text())


def stack_spec(a: argparse.Namespace, model: str, fam: Family, slots: int | None) -> StackSpec:
    """The serving stack of ``run_gpu.py``'s options for ``model`` with ``slots`` slots in all."""
    chunks = None
    if a.chunk_schedule:
        initial, steady = (int(x) for x in a.chunk_schedule.split(","))
        chunks = (initial, steady)
    return StackSpec(
        model, a.device, a.frames, slots, a.max_model_len, chunks, a.threads, tuple(a.set), fam.deploy,
        pairs=a.pairs, pair_memory_fraction=a.pair_memory_fraction,
        pairs_share_device=getattr(a, "pairs_share_device", True),
    )  # fmt: skip


def start_stack(
    a: argparse.Namespace, model: str, tag: str, fam: Family, out: Path
) -> tuple[Stack | None, int | None]:
    """The stack and its total slot count; a stack that cannot start is retried with half the slots."""
    slots = a.slots
    for _ in range(3):
        stack = Stack(stack_spec(a, model, fam, slots), out / f"serve_{tag}.log")
        if stack.start():
            return stack, slots
        print(f"stack for {model} with {slots} slots did not start:\n{stack.tail()}", flush=True)
        stack.stop()
        if slots is None or slots <= a.pairs:
            break
        slots //= 2
    return None, slots


def serve_phases(
    a: argparse.Namespace, model: str, tag: str, fam: Family, phases: list[str], out: Path, prof: Profile
) -> None:
    stack, slots = start_stack(a, model, tag, fam, out)
    if stack is None:
        failed = {"model": model, "slots": a.slots, "pairs": a.pairs, "log": str(out / f"serve_{tag}.log")}
        (out / f"serve_{tag}_failed.json").write_text(json.dumps(failed) + "\n")
        return
    meta: dict = {"model": model, "command": stack.command(), "start_s": stack.start_s, "slots": slots}
    meta["pairs"] = a.pairs
    meta["layout"] = getattr(a, "layout_name", None)  # bench/layouts.py; None: the deploy file's placement
    meta["slots_per_replica"] = stack.spec.replica_slots()
    meta["chunk_schedule"] = a.chunk_schedule or "deploy"
    runs: list[dict] = []
    label = model + (f" ({a.pairs} pairs)" if a.pairs > 1 else "")  # plot series names
    label += f" [{meta['layout']}]" if meta["layout"] else ""
    common = ["--grpc", stack.grpc, "--http", stack.http, "--frames", str(a.frames), "--label", label]
    common += ["--voice", fam.voice, "--language", fam.language, "--frame-rate-hz", str(fam.frame_rate_hz)]
    common += ["--ttfa-slo-ms", str(a.ttfa_slo_ms), "--settle", "1" if a.profile == "smoke" else "3"]
    # Every level samples the stack's processes' CPU and the GPU's busy share (bench/procsample.py).
    common += ["--sample-pids", format_groups({**stack.process_groups(), "client": [os.getpid()]})]
    # ... and diffs the stages' metrics over it: the codec's late chunks by cause, chunk waits, ticks.
    common += ["--stage-metrics", format_urls(stack.stage_metrics_urls())]
    level = ["--duration", str(prof.level_s), "--warmup", str(prof.level_warmup_s)]
    level += ["--search-refine", str(prof.refine)]
    top = min(prof.conc_max, float(slots)) if slots else prof.conc_max
    closed_start = a.closed_start or prof.conc_start
    try:
        # Both stages capture their CUDA graphs at start-up; this ramp through the batch sizes the searches
        # will reach still warms what is lazy (allocator growth, channels, oversize codec buckets).
        ramp_top = slots or 8
        for n_streams in sorted({1, min(4, ramp_top), min(16, ramp_top), min(64, ramp_top), ramp_top}):
            n = 2 * n_streams if n_streams <= 16 else n_streams
            args = [*common, "--closed", str(n_streams), "--requests", str(n), "--duration", "600"]
            run_loadgen(out, f"warmup_{tag}_c{n_streams}", args, runs)
        stack.scrape(out / f"metrics_{tag}_0warm")
        if "latency" in phases:
            args = [*common, "--poisson", "1", "--duration", str(prof.ttfa_s)]
            run_loadgen(out, f"ttfa_1rps_{tag}", [*args, "--warmup", str(prof.ttfa_warmup_s)], runs)
            c1 = [*common, "--closed", "1", "--duration", "600"]
            run_loadgen(out, f"c1_{tag}", [*c1, "--requests", str(prof.c1_requests)], runs)
            few = [*c1, "--requests", str(max(2, prof.c1_requests // 2))]
            run_loadgen(out, f"c1_seed_schedule_{tag}", [*few, "--chunk-schedule", fam.seed_schedule], runs)
            run_loadgen(out, f"c1_http_{tag}", [*few, "--api", "http"], runs)
            stack.scrape(out / f"metrics_{tag}_1latency")
        if "poisson" in phases:
            args = [*common, *level, "--search", "poisson", "--search-start", str(prof.rate_start)]
            run_loadgen(out, f"poisson_search_{tag}", [*args, "--search-max", str(prof.rate_max)], runs)
            stack.scrape(out / f"metrics_{tag}_2poisson")
        if "closed" in phases:
            args = [*common, *level, "--search", "closed", "--search-start", str(min(closed_start, top))]
            run_loadgen(out, f"closed_search_{tag}", [*args, "--search-max", str(top)], runs)
            stack.scrape(out / f"metrics_{tag}_3closed")
        if "openai" in phases:
            oa = [*common, "--api", "openai"]
            c1 = [*oa, "--closed", "1", "--duration", "600", "--requests", str(prof.c1_requests)]
            run_loadgen(out, f"c1_openai_{tag}", c1, runs)
            args = [*oa, *level, "--search", "closed", "--search-start", str(min(closed_start, top))]
            run_loadgen(out, f"closed_search_openai_{tag}", [*args, "--search-max", str(top)], runs)
            stack.scrape(out / f"metrics_{tag}_5openai")
        if "llm" in phases or "llm_poisson" in phases:
            meta["llm"] = {"tokens_per_s": a.llm_tokens_per_s, "search_max": a.llm_search_max}
            meta["llm"]["segment_frames"] = a.llm_segment_frames or "frames / sentences"
            llm = [*common, "--text-mode", "llm", "--tokens-per-s", str(a.llm_tokens_per_s)]
            llm += ["--segment-frames", str(a.llm_segment_frames), "--label", f"{label} LLM deltas"]
            llm_phases(a, tag, phases, out, prof, llm, level, top, runs)
            stack.scrape(out / f"metrics_{tag}_4llm")
    finally:
        meta["exit_code"] = stack.stop()
        meta["runs"] = runs
        (out / f"serve_{tag}.json").write_text(json.dumps(meta, indent=1) + "\n")


def llm_phases(
    a: argparse.Namespace,
    tag: str,
    phases: list[str],
    out: Path,
    prof: Profile,
    llm: list[str],
    level: list[str],
    top: float,
    runs: list[dict],
) -> None:
    """The whole-text measurements again with text streamed at an LLM's rate (same gate, same stack)."""
    if "llm" in phases:
        args = [*llm, "--poisson", "1", "--duration", str(prof.llm_ttfa_s)]
        run_loadgen(out, f"ttfa_1rps_llm_{tag}", [*args, "--warmup", str(prof.ttfa_warmup_s)], runs)
        args = [*llm, "--closed", "1", "--duration", "600", "--requests", str(prof.llm_c1_requests)]
        run_loadgen(out, f"c1_llm_{tag}", args, runs)
        # Every stream holds a gateway admission slot for its whole text (about 7 s at 30 tokens/s), so the
        # search stops at the slot count as the whole-text one does.
        llm_top = min(float(a.llm_search_max), top)
        start = min(prof.llm_conc_start, llm_top)
        args = [*llm, *level, "--search", "closed", "--search-start", str(start)]
        run_loadgen(out, f"closed_search_llm_{tag}", [*args, "--search-max", str(llm_top)], runs)
    if "llm_poisson" in phases:
        args = [*llm, *level, "--search", "poisson", "--search-start", str(prof.llm_rate_start)]
        run_loadgen(out, f"poisson_search_llm_{tag}", [*args, "--search-max", str(prof.rate_max)], runs)
