"""Load generator for a running voxstage gateway: open-loop Poisson and closed-loop concurrency.

    python -m bench.loadgen --grpc 127.0.0.1:50051 --poisson 1,2,4 --duration 60 --warmup 10 --out r.json
    python -m bench.loadgen --grpc 127.0.0.1:50051 --closed 1,8,32 --requests 64 --frames 100 --out c.json
    python -m bench.loadgen --grpc 127.0.0.1:50051 --search closed --frames 100 --out s.json --plots plots/
    python -m bench.loadgen --http 127.0.0.1:8000 --api http --closed 1 --requests 10 --out h.json
    python -m bench.loadgen --http 127.0.0.1:8000 --api openai --closed 1 --requests 10 --out o.json

Open loop (Nari): arrivals are a Poisson process independent of completions, so queueing shows up in TTFA
instead of slowing the client down. Closed loop (vLLM-Omni): ``c`` workers each send their next request when
the previous one ends. ``--search`` doubles the level until the gate fails (an error, an underrun, a wrong
audio length or p95 TTFA over ``--ttfa-slo-ms``), then bisects between the last pass and the first failure.

Fixed-length mode (``--frames N``) sends ``max_frames = N`` and checks every clip is N x 80 ms. The public
API has no minimum, so EOS must be disabled on the server: start it with
``--set stages.0.default_sampling_params.min_tokens=N`` (``bench/run_gpu.py`` does).

LLM-rate mode (``--text-mode llm --tokens-per-s 30``): each ``StreamingSynthesize`` call streams an answer
from ``prompts/llm_answers.txt`` as word-piece deltas on an absolute schedule, a flush per sentence, then
half-closes (``bench/llm_stream.py``); ``max_frames`` is then per segment, ``ceil(N / sentences)``, and every
clip must be exactly that times the sentence count. TTFA counts from the first delta (the request start).

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
from pathlib import Path
from typing import Any

from bench.clients import Client, GrpcStreamClient, GrpcUnaryClient, HttpStreamClient
from bench.levels import RunConfig, run_level, search
from bench.llm_stream import ANSWERS, GrpcLlmClient
from bench.procsample import parse_groups
from bench.prom import parse_urls
from bench.records import Gate

PROMPTS = Path(__file__).resolve().parent / "prompts" / "en_sentences.txt"
MAX_REQUESTS_PER_LEVEL = 20_000


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
    ap.add_argument(
        "--api", choices=("grpc", "grpc-unary", "http", "openai"), default="grpc",
        help="http: a fresh connection per request; openai: the official client, kept-alive connections",
    )  # fmt: skip
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
    ap.add_argument(
        "--text-mode",
        choices=("whole", "llm"),
        default="whole",
        help="whole: each text at once; llm: deltas at --tokens-per-s, a flush per sentence (gRPC streaming)",
    )
    ap.add_argument("--tokens-per-s", type=float, default=30.0, help="llm text mode: deltas per second")
    ap.add_argument(
        "--segment-frames",
        type=int,
        default=0,
        help="llm text mode: max_frames per segment; 0 = ceil(--frames / sentences)",
    )
    ap.add_argument(
        "--prompts", type=Path, default=None, help=f"default {PROMPTS.name}; llm mode: {ANSWERS.name}"
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--voice", default="ryan", help="'' = the model's default voice")
    ap.add_argument("--language", default="english", help="'' = the model's default")
    ap.add_argument(
        "--ref-audio", type=Path, default=None, metavar="WAV",
        help="voice clone: send this WAV file inline with every request (gRPC), with --ref-text",
    )  # fmt: skip
    ap.add_argument("--ref-text", default="", help="transcript of --ref-audio")
    ap.add_argument(
        "--frame-rate-hz", type=float, default=12.5, help="codec frames per second (fixed-length check)"
    )
    ap.add_argument("--model", default="", help="served model name (empty: the deployment's default)")
    ap.add_argument("--timeout", type=float, default=120.0, help="per-request deadline (s)")
    ap.add_argument("--ttfa-slo-ms", type=float, default=1000.0, help="gate: p95 TTFA bound; 0 = none")
    ap.add_argument("--underrun-tolerance-ms", type=float, default=0.0)
    ap.add_argument("--label", default="", help="series name in plots (e.g. the model)")
    ap.add_argument(
        "--sample-pids", type=parse_groups, default=None, metavar="NAME=PID[+PID],...",
        help="per level: these processes' CPU %% and the GPU's busy %%, sampled every second (the level's "
        "'processes'), e.g. talker=11,codec=12,gateway=13",
    )  # fmt: skip
    ap.add_argument(
        "--stage-metrics", type=parse_urls, default=None, metavar="NAME=URL,...",
        help="per level: these stages' /metrics diffed over it (the level's 'stages': codec late chunks by "
        "cause, chunk waits, tick times), e.g. codec=http://127.0.0.1:9101/metrics",
    )  # fmt: skip
    ap.add_argument("--out", type=Path, required=True, help="JSON output file")
    ap.add_argument("--plots", type=Path, default=None, help="directory for PNG plots")
    return ap


def make_client(args: argparse.Namespace) -> Client:
    if args.text_mode == "llm":
        if args.api != "grpc":
            raise SystemExit("--text-mode llm streams text deltas: only --api grpc (StreamingSynthesize) can")
        require_loopback(args.grpc)
        return GrpcLlmClient(args.grpc, channels=args.grpc_channels, tokens_per_s=args.tokens_per_s)
    if args.api == "http":
        host, port = require_loopback(args.http)
        return HttpStreamClient(host, port)
    if args.api == "openai":
        from bench.openai_client import OpenAIClient  # the openai package only where this API is measured

        return OpenAIClient(*require_loopback(args.http))
    require_loopback(args.grpc)
    cls = GrpcStreamClient if args.api == "grpc" else GrpcUnaryClient
    return cls(args.grpc, channels=args.grpc_channels)


async def amain(args: argparse.Namespace) -> dict[str, Any]:
    initial, steady = (int(x) for x in args.chunk_schedule.split(",")) if args.chunk_schedule else (0, 0)
    if args.ref_audio is not None and not args.api.startswith("grpc"):
        raise SystemExit("--ref-audio is sent in SynthesisConfig.reference_audio: a gRPC API only")
    if (initial or steady) and args.api != "grpc":
        raise SystemExit("--chunk-schedule is a gRPC StreamingSynthesize option; the HTTP API has none")
    if args.prompts is None:
        args.prompts = ANSWERS if args.text_mode == "llm" else PROMPTS
    cfg = RunConfig(
        prompts=load_prompts(args.prompts),
        seed=args.seed,
        voice=args.voice,
        language=args.language,
        model=args.model,
        frames=args.frames,
        frame_rate_hz=args.frame_rate_hz,
        initial_chunk_frames=initial,
        steady_chunk_frames=steady,
        timeout_s=args.timeout,
        warmup_s=args.warmup,
        tolerance_s=args.underrun_tolerance_ms / 1e3,
        gate=Gate(args.ttfa_slo_ms / 1e3 if args.ttfa_slo_ms > 0 else None),
        text_mode=args.text_mode,
        segment_frames=args.segment_frames,
        sample=args.sample_pids,
        stage_metrics=args.stage_metrics,
        reference_wav=args.ref_audio.read_bytes() if args.ref_audio is not None else b"",
        reference_text=args.ref_text,
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
    if hasattr(client, "transport"):
        doc["transport"] = client.transport()
    return doc


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    doc = asyncio.run(amain(args))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    # One line per level record would make multi-MB files; compact JSON, read it with a JSON tool.
    args.out.write_text(json.dumps(doc, separators=(",", ":")) + "\n")
    print(f"wrote {args.out}", flush=True)
    if args.plots is not None:
        from bench.plots import plot_files

        for path in plot_files([args.out], args.plots):
            print(f"wrote {path}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
