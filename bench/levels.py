"""One load level (open-loop Poisson or closed-loop concurrency) and the search for the highest sustained one.

Used by ``bench.loadgen`` (the CLI); see its docstring for the load models and bench/README.md for metrics.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from bench.clients import Client, Synthesis
from bench.llm_stream import llm_tokens, segment_budget, sentence_count
from bench.playback import percentile, poisson_arrivals
from bench.procsample import Sampler
from bench.prom import DECODE_PARTS, fetch, tts_stages
from bench.records import (
    FRAME_RATE_HZ,
    Gate,
    Outcome,
    RequestRecord,
    build_record,
    record_dict,
    summarize,
)

LAG_PROBE_S = 0.01
LAG_EVENT_S = 0.005  # a wake-up this late is recorded with its time (LagProbe.events)
ERROR_BACKOFF_S = 0.05  # closed loop: a refused worker waits this long instead of spinning


@dataclass
class RunConfig:
    prompts: list[str]
    seed: int = 0
    voice: str = "ryan"
    language: str = "english"
    model: str = ""
    frames: int | None = None
    frame_rate_hz: float = FRAME_RATE_HZ  # the model's codec frames per second (fixed-length check)
    initial_chunk_frames: int = 0
    steady_chunk_frames: int = 0
    timeout_s: float = 120.0
    warmup_s: float = 0.0
    tolerance_s: float = 0.0
    gate: Gate = field(default_factory=Gate)
    # "whole": each request's text at once; "llm": deltas at an LLM's rate, one segment per sentence
    # (bench/llm_stream.py), ``frames`` then split evenly over the sentences.
    text_mode: str = "whole"
    segment_frames: int = 0  # LLM mode: per-segment max_frames; 0 = ceil(frames / sentences)
    # Process groups whose CPU (and the GPU's busy share) each level samples (bench/procsample.py).
    sample: dict[str, list[int]] | None = None
    # Stage processes' /metrics (name -> URL) read before and after each level (bench/prom.py, tts_stages).
    stage_metrics: dict[str, str] | None = None
    reference_wav: bytes = b""  # gRPC: a voice-clone clip (WAV bytes) and its transcript on every request
    reference_text: str = ""

    def frame_budget(self, text: str) -> tuple[int | None, int | None]:
        """(``max_frames`` to send, sentences the client flushes): per segment in LLM mode."""
        if self.text_mode != "llm":
            return self.frames, None
        sentences = sentence_count(llm_tokens(text))
        if self.segment_frames:
            return self.segment_frames, sentences
        return (None if self.frames is None else segment_budget(self.frames, sentences)), sentences


class LagProbe:
    """How late the event loop wakes up: if this grows, the client (not the server) adds latency."""

    def __init__(self) -> None:
        self.samples: list[float] = []
        # (time.monotonic() at wake-up, lag s) of every wake-up later than LAG_EVENT_S: when the loop was
        # blocked, so that a late chunk read then can be told from one the server sent late.
        self.events: list[tuple[float, float]] = []
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        while True:
            t = time.perf_counter()
            await asyncio.sleep(LAG_PROBE_S)
            lag = time.perf_counter() - t - LAG_PROBE_S
            self.samples.append(lag)
            if lag > LAG_EVENT_S:
                self.events.append((time.monotonic(), lag))

    def __enter__(self) -> LagProbe:
        self._task = asyncio.get_running_loop().create_task(self._run())
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()

    def summary(self) -> dict[str, float | None]:
        ms = [1e3 * s for s in self.samples]
        return {"p50": percentile(ms, 50), "p99": percentile(ms, 99), "max": max(ms, default=None)}


class Level:
    """One load level: issues requests, keeps their records and the in-flight high-water mark."""

    def __init__(self, client: Client, cfg: RunConfig, kind: str, value: float) -> None:
        self.client, self.cfg, self.kind, self.value = client, cfg, kind, value
        self.records: list[RequestRecord] = []
        self.in_flight = 0
        self.peak = 0
        self.dispatch_lag: list[float] = []
        # One generator per level: the same seed replays the same arrivals and prompt choices.
        self.rng = np.random.default_rng([cfg.seed, int(value * 1000), 0 if kind == "poisson" else 1])
        self.start = time.perf_counter()

    async def one(self, index: int, scheduled_s: float) -> None:
        cfg = self.cfg
        prompt_id = int(self.rng.integers(len(cfg.prompts)))
        text = cfg.prompts[prompt_id]
        seed = cfg.seed * 1_000_003 + index
        max_frames, sentences = cfg.frame_budget(text)
        synth = Synthesis(
            text=text,
            seed=seed,
            voice=cfg.voice,
            language=cfg.language,
            model=cfg.model,
            max_frames=max_frames,
            initial_chunk_frames=cfg.initial_chunk_frames,
            steady_chunk_frames=cfg.steady_chunk_frames,
            reference_wav=cfg.reference_wav,
            reference_text=cfg.reference_text,
        )
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        try:
            out = await self.client.run(synth, cfg.timeout_s)
        except (OSError, ConnectionError) as exc:
            out = Outcome(start=time.perf_counter(), code="CONNECT", detail=f"{type(exc).__name__}: {exc}")
        finally:
            self.in_flight -= 1
        self.records.append(
            build_record(
                out,
                index=index,
                api=self.client.api,
                prompt_id=prompt_id,
                text=text,
                seed=seed,
                level_start=self.start,
                done=time.perf_counter(),
                scheduled_s=scheduled_s,
                warmup=scheduled_s < cfg.warmup_s,
                fixed_frames=max_frames if cfg.frames is not None else None,
                sentences=sentences,
                frame_rate_hz=cfg.frame_rate_hz,
                tolerance_s=cfg.tolerance_s,
            )
        )

    async def open_loop(self, rate: float, duration_s: float, max_requests: int) -> None:
        arrivals = poisson_arrivals(rate, self.cfg.warmup_s + duration_s, self.rng, max_count=max_requests)
        tasks = []
        self.start = time.perf_counter()
        for i, offset in enumerate(arrivals):
            delay = self.start + offset - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            self.dispatch_lag.append(time.perf_counter() - self.start - offset)
            tasks.append(asyncio.create_task(self.one(i, offset)))
        await asyncio.gather(*tasks)  # each request carries its own deadline, so this ends

    async def closed_loop(self, concurrency: int, duration_s: float, max_requests: int) -> None:
        counter = iter(range(max_requests))
        self.start = time.perf_counter()
        deadline = self.start + self.cfg.warmup_s + duration_s

        async def worker() -> None:
            while time.perf_counter() < deadline:
                index = next(counter, None)
                if index is None:
                    return
                await self.one(index, time.perf_counter() - self.start)
                if not self.records[-1].ok:
                    await asyncio.sleep(ERROR_BACKOFF_S)

        await asyncio.gather(*(worker() for _ in range(concurrency)))

    def report(self, lag: LagProbe, duration_s: float) -> dict[str, Any]:
        records = sorted(self.records, key=lambda r: r.index)
        agg = summarize(
            records, peak_in_flight=self.peak, offered_rate=self.value if self.kind == "poisson" else None
        )
        passed, why = self.cfg.gate.verdict(agg)
        lags = [1e3 * x for x in self.dispatch_lag]
        return {
            "kind": self.kind,
            "level": self.value,
            "duration_s": duration_s,
            "warmup_s": self.cfg.warmup_s,
            "aggregate": agg,
            "verdict": {"pass": passed, "reason": why},
            "client": {
                "loop_lag_ms": lag.summary(),
                "dispatch_lag_ms": {"p99": percentile(lags, 99), "max": max(lags, default=None)},
            },
            "records": [record_dict(r) for r in records],
        }


async def run_level(
    client: Client, cfg: RunConfig, kind: str, value: float, duration_s: float, max_requests: int
) -> dict[str, Any]:
    level = Level(client, cfg, kind, value)
    sampler = Sampler(cfg.sample) if cfg.sample is not None else None
    urls = cfg.stage_metrics or {}
    before = await asyncio.to_thread(fetch, urls) if urls else {}
    with LagProbe() as lag, sampler or contextlib.nullcontext():
        if kind == "poisson":
            await level.open_loop(value, duration_s, max_requests)
        else:
            await level.closed_loop(int(value), duration_s, max_requests)
    report = level.report(lag, duration_s)
    if sampler is not None:
        report["processes"] = sampler.summary()
    if urls:  # the level's own counts, its warm-up included
        report["stages"] = tts_stages(before, await asyncio.to_thread(fetch, urls))
    _print_level(report)
    return report


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1e3:.0f}"


def _print_level(rep: dict[str, Any]) -> None:
    a = rep["aggregate"]
    unit = "req/s" if rep["kind"] == "poisson" else "streams"
    rtf = a["rtf"]["p50"]
    print(
        f"{rep['kind']:>7} {rep['level']:>7g} {unit}: n={a['requests']} ok={a['ok']} "
        f"TTFA p50/p95/p99 {_ms(a['ttfa_s']['p50'])}/{_ms(a['ttfa_s']['p95'])}/{_ms(a['ttfa_s']['p99'])} ms "
        f"RTF p50 {'-' if rtf is None else f'{rtf:.3f}'} underrun {a['underrun_requests']}/{a['ok']} "
        f"errors {a['errors_by_code'] or 0}{_late_chunks(rep)} "
        f"-> {'PASS' if rep['verdict']['pass'] else 'FAIL'} ({rep['verdict']['reason']})",
        flush=True,
    )


def _late_chunks(rep: dict[str, Any]) -> str:
    """The level line's tail, ``late chunks frames/codec N/M, padding P % of decoded rows``, over the level's
    codecs, when it read the stages' metrics."""
    codecs = [row["late_chunks"] for row in rep.get("stages", {}).values() if "late_chunks" in row]
    if not codecs:
        return ""
    n = {c: sum(int(row[c]["count"] or 0) for row in codecs) for c in ("frames", "codec")}
    rows = [row["decode_rows"] for row in rep["stages"].values() if "decode_rows" in row]
    computed = sum(r[p] for r in rows for p in DECODE_PARTS)
    padding = sum(r["padding"] for r in rows)
    pad = f", padding {100 * padding / computed:.0f} % of decoded rows" if computed else ""
    return f" late chunks frames/codec {n['frames']}/{n['codec']}{pad}"


def _midpoint(lo: float, hi: float, integer: bool) -> float | None:
    if integer:
        mid = (int(lo) + int(hi)) // 2
        return float(mid) if int(lo) < mid < int(hi) else None
    mid = round((lo + hi) / 2, 2)
    return mid if hi - lo > 0.1 * hi and lo < mid < hi else None  # stop at 10 % resolution


async def search(
    client: Client,
    cfg: RunConfig,
    kind: str,
    *,
    start: float,
    factor: float,
    max_level: float,
    refine: int,
    duration_s: float,
    max_requests: int,
    settle_s: float,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Highest level that passes the gate: geometric steps up (or down, when ``start`` already fails), then
    bisection. At most ``log_factor(max/start) + 1 + refine`` levels run going up, 7 + ``refine`` going
    down."""
    integer = kind == "closed"
    levels: list[dict[str, Any]] = []
    best: float | None = None
    failed: float | None = None

    async def passes(level: float) -> bool:
        rep = await run_level(client, cfg, kind, level, duration_s, max_requests)
        levels.append(rep)
        await asyncio.sleep(settle_s)
        return bool(rep["verdict"]["pass"])

    value = start
    while True:
        if not await passes(value):
            failed = value
            break
        best = value
        if value >= max_level:
            break
        value = min(max_level, float(max(int(value) + 1, int(value * factor))) if integer else value * factor)
    # A start above capacity: step down the same way until a level passes (at most as far as start / 64).
    floor = 1.0 if integer else start / 64
    while best is None and failed is not None:
        value = float(int(failed / factor)) if integer else round(failed / factor, 3)
        if value < floor:
            break
        if await passes(value):
            best = value
        else:
            failed = value
    for _ in range(refine):
        if best is None or failed is None:
            break
        mid = _midpoint(best, failed, integer)
        if mid is None:
            break
        if await passes(mid):
            best = mid
        else:
            failed = mid
    limited_by = "gate" if failed is not None else "max_level"
    if best is None:
        limited_by = "no level passed"
    result = {"kind": kind, "best": best, "first_failure": failed, "limited_by": limited_by}
    print(f"search {kind}: best {best} (first failure {failed}, limited by {limited_by})", flush=True)
    return levels, result
