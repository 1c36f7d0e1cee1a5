"""Load generator for a running voxstage gateway: open-loop Poisson and closed-loop concurrency.

    python -m bench.loadgen --grpc 127.0.0.1:50051 --poisson 1,2,4 --duration 60 --warmup 10 --out r.json
    python -m bench.loadgen --grpc 127.0.0.1:50051 --closed 1,8,32 --requests 64 --frames 100 --out c.json
    python -m bench.loadgen --grpc 127.0.0.1:50051 --search closed --frames 100 --out s.json --plots plots/
    python -m bench.loadgen --http 127.0.0.1:8000 --api http --closed 1 --requests 10 --out h.json

Open loop (Nari): arrivals are a Poisson process independent of completions, so queueing shows up in TTFA
instead of slowing the client down. Closed loop (vLLM-Omni): ``c`` workers each send their next request when
the previous one ends. ``--search`` doubles the level until the gate fails (an error, an underrun, a wrong
audio length or p95 TTFA over ``--ttfa-slo-ms``), then bisects between the last pass and the first failure.

Fixed-length mode (``--frames N``) sends ``max_frames = N`` and checks every clip is N x 80 ms. The public
API has no minimum, so EOS must be disabled on the server: start it with
``--set stages.0.default_sampling_params.min_tokens=N`` (``bench/run_gpu.py`` does).

Bounded by construction: every level has a duration or request cap, every request a deadline, and targets
must be loopback addresses. See bench/README.md for the metric definitions.
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import json
import platform
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from bench.clients import Client, GrpcStreamClient, GrpcUnaryClient, HttpStreamClient, Synthesis
from bench.playback import percentile, poisson_arrivals
from bench.records import Gate, Outcome, RequestRecord, build_record, record_dict, summarize

PROMPTS = Path(__file__).resolve().parent / "prompts" / "en_sentences.txt"
MAX_REQUESTS_PER_LEVEL = 20_000
LAG_PROBE_S = 0.01
ERROR_BACKOFF_S = 0.05  # closed loop: a refused worker waits this long instead of spinning


def require_loopback(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    infos = socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM)
    addrs = {info[4][0] for info in infos}
    if not addrs or not all(ipaddress.ip_address(a.split("%")[0]).is_loopback for a in addrs):
        raise SystemExit(f"{address}: resolves to {sorted(addrs)}; the load generator only targets loopback")
    return host, int(port)


def load_prompts(path: Path) -> list[str]:
    lines = [ln.strip() for ln in path.read_text(encoding="utf-8").splitlines()]
    prompts = [ln for ln in lines if ln and not ln.startswith("#")]
    if not prompts:
        raise SystemExit(f"{path}: no prompts")
    return prompts


@dataclass
class RunConfig:
    prompts: list[str]
    seed: int = 0
    voice: str = "ryan"
    language: str = "english"
    model: str = ""
    frames: int | None = None
    initial_chunk_frames: int = 0
    steady_chunk_frames: int = 0
    timeout_s: float = 120.0
    warmup_s: float = 0.0
    tolerance_s: float = 0.0
    gate: Gate = field(default_factory=Gate)


class LagProbe:
    """How late the event loop wakes up: if this grows, the client (not the server) adds latency."""

    def __init__(self) -> None:
        self.samples: list[float] = []
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        while True:
            t = time.perf_counter()
            await asyncio.sleep(LAG_PROBE_S)
            self.samples.append(time.perf_counter() - t - LAG_PROBE_S)

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
        synth = Synthesis(
            text=text,
            seed=seed,
            voice=cfg.voice,
            language=cfg.language,
            model=cfg.model,
            max_frames=cfg.frames,
            initial_chunk_frames=cfg.initial_chunk_frames,
            steady_chunk_frames=cfg.steady_chunk_frames,
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
                fixed_frames=cfg.frames,
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
    with LagProbe() as lag:
        if kind == "poisson":
            await level.open_loop(value, duration_s, max_requests)
        else:
            await level.closed_loop(int(value), duration_s, max_requests)
    report = level.report(lag, duration_s)
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
        f"errors {a['errors_by_code'] or 0} -> {'PASS' if rep['verdict']['pass'] else 'FAIL'}"
        f" ({rep['verdict']['reason']})",
        flush=True,
    )


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
    """Highest level that passes the gate: geometric steps up, then bisection. At most
    ``log_factor(max/start) + 1 + refine`` levels run."""
    integer = kind == "closed"
    levels: list[dict[str, Any]] = []
    best: float | None = None
    failed: float | None = None
    value = start
    while True:
        rep = await run_level(client, cfg, kind, value, duration_s, max_requests)
        levels.append(rep)
        await asyncio.sleep(settle_s)
        if not rep["verdict"]["pass"]:
            failed = value
            break
        best = value
        if value >= max_level:
            break
        value = min(max_level, float(max(int(value) + 1, int(value * factor))) if integer else value * factor)
    for _ in range(refine):
        if best is None or failed is None:
            break
        mid = _midpoint(best, failed, integer)
        if mid is None:
            break
        rep = await run_level(client, cfg, kind, mid, duration_s, max_requests)
        levels.append(rep)
        await asyncio.sleep(settle_s)
        if rep["verdict"]["pass"]:
            best = mid
        else:
            failed = mid
    limited_by = "gate" if failed is not None else "max_level"
    if best is None:
        limited_by = "first level failed"
    result = {"kind": kind, "best": best, "first_failure": failed, "limited_by": limited_by}
    print(f"search {kind}: best {best} (first failure {failed}, limited by {limited_by})", flush=True)
    return levels, result


def _levels(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()]


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m bench.loadgen",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--grpc", default="127.0.0.1:50051", help="gateway gRPC address (loopback)")
    ap.add_argument("--http", default="127.0.0.1:8000", help="gateway HTTP address (loopback)")
    ap.add_argument("--api", choices=("grpc", "grpc-unary", "http"), default="grpc")
    ap.add_argument("--grpc-channels", type=int, default=4, help="HTTP/2 connections, used round-robin")
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--poisson", type=_levels, metavar="RATES", help="open loop: req/s levels, e.g. 1,2,4")
    mode.add_argument("--closed", type=_levels, metavar="CONCS", help="closed loop: concurrency levels")
    mode.add_argument("--search", choices=("poisson", "closed"), help="find the highest passing level")
    ap.add_argument("--search-start", type=float, default=1.0)
    ap.add_argument("--search-factor", type=float, default=2.0)
    ap.add_argument("--search-max", type=float, default=256.0)
    ap.add_argument("--search-refine", type=int, default=2, help="bisection steps after the first failure")
    ap.add_argument("--duration", type=float, default=60.0, help="measured seconds per level")
    ap.add_argument("--warmup", type=float, default=0.0, help="seconds per level run but not measured")
    ap.add_argument("--requests", type=int, default=MAX_REQUESTS_PER_LEVEL, help="request cap per level")
    ap.add_argument("--settle", type=float, default=2.0, help="pause between levels (s)")
    ap.add_argument("--frames", type=int, default=None, help="fixed-length mode: N frames per request")
    ap.add_argument(
        "--chunk-schedule", default=None, metavar="I,S", help="gRPC per-request chunk schedule override"
    )
    ap.add_argument("--prompts", type=Path, default=PROMPTS)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--voice", default="ryan")
    ap.add_argument("--language", default="english")
    ap.add_argument("--model", default="", help="served model name (empty: the deployment's default)")
    ap.add_argument("--timeout", type=float, default=120.0, help="per-request deadline (s)")
    ap.add_argument("--ttfa-slo-ms", type=float, default=1000.0, help="gate: p95 TTFA bound; 0 = none")
    ap.add_argument("--underrun-tolerance-ms", type=float, default=0.0)
    ap.add_argument("--label", default="", help="series name in plots (e.g. the model)")
    ap.add_argument("--out", type=Path, required=True, help="JSON output file")
    ap.add_argument("--plots", type=Path, default=None, help="directory for PNG plots")
    return ap


def make_client(args: argparse.Namespace) -> Client:
    if args.api == "http":
        host, port = require_loopback(args.http)
        return HttpStreamClient(host, port)
    require_loopback(args.grpc)
    cls = GrpcStreamClient if args.api == "grpc" else GrpcUnaryClient
    return cls(args.grpc, channels=args.grpc_channels)


async def amain(args: argparse.Namespace) -> dict[str, Any]:
    initial, steady = (int(x) for x in args.chunk_schedule.split(",")) if args.chunk_schedule else (0, 0)
    if (initial or steady) and args.api != "grpc":
        raise SystemExit("--chunk-schedule is a gRPC StreamingSynthesize option; the HTTP API has none")
    cfg = RunConfig(
        prompts=load_prompts(args.prompts),
        seed=args.seed,
        voice=args.voice,
        language=args.language,
        model=args.model,
        frames=args.frames,
        initial_chunk_frames=initial,
        steady_chunk_frames=steady,
        timeout_s=args.timeout,
        warmup_s=args.warmup,
        tolerance_s=args.underrun_tolerance_ms / 1e3,
        gate=Gate(args.ttfa_slo_ms / 1e3 if args.ttfa_slo_ms > 0 else None),
    )
    client = make_client(args)
    doc: dict[str, Any] = {
        "tool": "bench.loadgen",
        "format": 1,
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "host": platform.node(),
        "label": args.label,
        "config": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "levels": [],
        "search": None,
    }
    try:
        await client.connect(30.0)
        bound = min(args.requests, MAX_REQUESTS_PER_LEVEL)
        if args.search:
            doc["levels"], doc["search"] = await search(
                client,
                cfg,
                args.search,
                start=args.search_start,
                factor=args.search_factor,
                max_level=args.search_max,
                refine=args.search_refine,
                duration_s=args.duration,
                max_requests=bound,
                settle_s=args.settle,
            )
        else:
            kind, values = ("poisson", args.poisson) if args.poisson else ("closed", args.closed)
            for value in values:
                doc["levels"].append(await run_level(client, cfg, kind, value, args.duration, bound))
                await asyncio.sleep(args.settle)
    finally:
        await client.aclose()
    return doc


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    doc = asyncio.run(amain(args))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {args.out}", flush=True)
    if args.plots is not None:
        from bench.plots import plot_files

        for path in plot_files([args.out], args.plots):
            print(f"wrote {path}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
