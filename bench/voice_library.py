"""Time to first audio with a voice-library voice, against the same clip inline and a built-in voice
(issue 30).

    python -m bench.voice_library --out OUT --model CLONING_PRESET [--builtin-model PRESET]
        [--builtin-voice NAME] [--device cuda] [--rate 1] [--duration 60] [--frames 50] [--clip-seconds 10]
        [--arms uploaded,inline,uploaded_xvector,builtin] [--rounds 4]

One ``voxstage serve`` stack of ``--model`` (a cloning checkpoint, with a voice store under OUT) gets one
``--clip-seconds`` clip uploaded once (``POST /v1/audio/voices``); a second stack of ``--builtin-model`` runs
beside it on the same device (each of the four stages given 0.2 of its memory unless ``--set`` says
otherwise). Then the arms take turns, ``--rounds`` rounds of ``--duration / --rounds`` s each at ``--rate``
req/s Poisson (``bench.loadgen``, gRPC StreamingSynthesize, fixed length: EOS off for ``--frames``), so
that drift over the run (clocks, the stacks' age) falls on every arm alike; the arms run one at a time:

* ``uploaded``: ``voice`` = the uploaded voice's name (the codec encoded the clip at upload; the talker
  caches its prompt);
* ``uploaded_xvector``: the same clip uploaded without a transcript, where the family allows it (Qwen3-TTS
  Base: speaker-embedding-only cloning, a prompt as long as a built-in voice's): the library's own cost
  apart from the in-context clone's longer prompt; recorded as skipped where the upload is refused;
* ``inline``: ``reference_audio`` = the same clip and transcript on every request (encoded every time);
* ``builtin``: a preset voice (``--builtin-voice``) of ``--builtin-model``, the same size without cloning,
  on its own stack (``--builtin-model ''`` skips it).

Writes ``OUT/voice_ttfa_<arm>_<tag>_r<round>.json`` (loadgen's format, per request) and
``OUT/voice_library_<tag>.json``: per arm p50/p90/p95/p99/mean TTFA (client and the gateway's own), each
round's p50, and errors, and the differences
``uploaded - builtin``, ``uploaded_xvector - builtin`` and ``inline - uploaded`` (ms), with a 95 %
bootstrap interval of each p50 difference (``diff_p50_interval_ms``). Every arm is preceded
by an unmeasured warm-up level; ``--arms`` runs a subset (a short device lease: ``uploaded,builtin``).
``--stamps`` starts the stacks with ``bench/stamp_hook``, which stamps each request's way to its first audio
in every process (``bench/stamps.py``): each arm's ``path`` gives every point's time after the gateway's
open and every hop's p50 and mean, and ``path_diff_ms`` each hop's difference to the built-in voice, so a
gap between the arms is placed in a stage or between two.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from bench import loadgen, stamps
from bench.stack import Stack, StackSpec
from voxstage import families

REF_TEXT = (
    "The north wind and the sun were disputing which was the stronger, when a traveler came along "
    "wrapped in a warm cloak."
)
VOICE = "bench-voice"
XVECTOR_VOICE = "bench-voice-xvector"  # the same clip, no transcript
ARMS = ("uploaded", "inline", "uploaded_xvector", "builtin")


def clip_wav(seconds: float, rate: int = 24_000, seed: int = 0) -> bytes:
    """A deterministic voiced-like clip (a gliding harmonic tone with syllable-rate gating and a little
    noise): the same bytes on every run, so the uploaded and inline arms clone from one clip."""
    import soundfile as sf

    t = np.arange(int(seconds * rate)) / rate
    f0 = 120 + 30 * np.sin(2 * np.pi * 0.3 * t)
    phase = 2 * np.pi * np.cumsum(f0) / rate
    voiced = sum(0.25 / k * np.sin(k * phase) for k in range(1, 8))
    gate = 0.55 + 0.45 * np.sin(2 * np.pi * 4.0 * t) ** 2
    noise = 0.01 * np.random.default_rng(seed).standard_normal(t.size)
    buf = io.BytesIO()
    sf.write(buf, (voiced * gate + noise).astype(np.float32), rate, format="WAV", subtype="PCM_16")
    return buf.getvalue()


def upload(http: str, name: str, wav: bytes, text: str) -> dict[str, Any]:
    boundary = uuid.uuid4().hex
    parts = []
    for key, value in (("name", name), ("ref_text", text)):
        if not value:
            continue  # no transcript: the field is left out, as a client that has none would
        head = f'--{boundary}\r\nContent-Disposition: form-data; name="{key}"\r\n\r\n'
        parts.append(f"{head}{value}\r\n".encode())
    parts.append(
        f'--{boundary}\r\nContent-Disposition: form-data; name="audio"; filename="clip.wav"\r\n'
        "Content-Type: audio/wav\r\n\r\n".encode() + wav + b"\r\n"
    )
    body = b"".join(parts) + f"--{boundary}--\r\n".encode()
    request = urllib.request.Request(
        f"http://{http}/v1/audio/voices", data=body, method="POST",
        headers={"Content-Type": f"multipart/form-data; boundary={boundary}"},
    )  # fmt: skip
    with urllib.request.urlopen(request, timeout=120) as r:
        return dict(json.loads(r.read()))


def ttfa_values(docs: list[dict[str, Any]]) -> list[float]:
    """Each answered request's TTFA (ms) over the measured levels of ``docs``."""
    ok = [r for doc in docs for r in doc["levels"][-1]["records"] if r["ok"]]
    return [r["ttfa_s"] * 1e3 for r in ok if r.get("ttfa_s") is not None]


def p50_diff_interval(x: list[float], y: list[float], draws: int = 4000, seed: int = 0) -> list[float]:
    """A 95 % bootstrap interval of ``p50(x) - p50(y)`` (ms), each arm's requests resampled apart: with a
    few dozen requests an arm, its p50 moves by a millisecond or more between runs, and a verdict of
    "within 2 ms" needs to say how far the measurement can be trusted."""
    rng = np.random.default_rng(seed)
    xs, ys = np.asarray(x), np.asarray(y)
    mx = np.median(xs[rng.integers(0, len(xs), (draws, len(xs)))], axis=1)
    my = np.median(ys[rng.integers(0, len(ys), (draws, len(ys)))], axis=1)
    lo, hi = np.percentile(mx - my, [2.5, 97.5])
    return [round(float(lo), 3), round(float(hi), 3)]


def summarize(docs: list[dict[str, Any]]) -> dict[str, Any]:
    """TTFA (ms) and request counts over the measured levels of ``docs`` (one per round)."""
    levels = [doc["levels"][-1] for doc in docs]
    ok = [r for level in levels for r in level["records"] if r["ok"]]
    ttfa = ttfa_values(docs)
    # The gateway's own TTFA (receipt to first audio sent): the client's less its transport both ways.
    server = [r["server_ttfa_s"] * 1e3 for r in ok if r.get("server_ttfa_s") is not None]
    out: dict[str, Any] = {
        "requests": sum(level["aggregate"]["requests"] for level in levels),
        "ok": sum(level["aggregate"]["ok"] for level in levels),
        "errors": {},
    }
    for level in levels:
        for code, n in level["aggregate"].get("errors_by_code", {}).items():
            out["errors"][code] = out["errors"].get(code, 0) + n
    for key, values in (("ttfa_ms", ttfa), ("server_ttfa_ms", server)):
        if values:
            arr = np.asarray(values)
            out[key] = {
                "mean": round(float(arr.mean()), 3),
                **{f"p{q}": round(float(np.percentile(arr, q)), 3) for q in (50, 90, 95, 99)},
                "min": round(float(arr.min()), 3),
                "max": round(float(arr.max()), 3),
            }
    return out


@dataclass
class Arm:
    """One arm: the stack it runs on, its loadgen options, and each round's result file."""

    name: str
    stack: Stack
    extra: list[str]
    files: list[Path] = field(default_factory=list)
    windows: list[tuple[float, float]] = field(default_factory=list)  # its rounds' perf_counter spans


def loadgen_common(a: argparse.Namespace, stack: Stack) -> list[str]:
    common = ["--grpc", stack.grpc, "--frames", str(a.frames), "--settle", "1"]
    return common + ["--language", a.language, "--timeout", str(a.timeout), "--ttfa-slo-ms", "0"]


def warm_up(a: argparse.Namespace, arm: Arm, tag: str) -> None:
    warm = a.out / f"voice_warmup_{arm.name}_{tag}.json"
    args = [*loadgen_common(a, arm.stack), *arm.extra, "--seed", "0", "--closed", "1"]
    loadgen.main([*args, "--requests", str(a.warmup_requests), "--out", str(warm)])


def run_round(a: argparse.Namespace, arm: Arm, tag: str, index: int) -> None:
    """One round of ``arm``: ``--duration / --rounds`` seconds of Poisson arrivals (its own seed per round,
    so the rounds are not one arrival pattern repeated)."""
    path = a.out / f"voice_ttfa_{arm.name}_{tag}_r{index}.json"
    args = [*loadgen_common(a, arm.stack), *arm.extra, "--seed", str(index)]
    args += ["--poisson", str(a.rate), "--duration", str(a.duration / a.rounds), "--out", str(path)]
    t0 = time.perf_counter()
    loadgen.main(args)
    arm.windows.append((t0, time.perf_counter()))
    arm.files.append(path)


def arm_result(arm: Arm, stamped: bool) -> dict[str, Any]:
    docs = [json.loads(path.read_text()) for path in arm.files]
    rounds = [summarize([doc]).get("ttfa_ms", {}).get("p50") for doc in docs]
    out = {"files": [path.name for path in arm.files], "round_p50_ms": rounds, **summarize(docs)}
    if stamped:  # each hop of the arm's requests to their first audio, from its stack's stamps
        log = arm.stack.log.read_text(errors="replace")
        out["path"] = stamps.summary(stamps.requests(log, arm.windows))
    return out


def start(a: argparse.Namespace, model: str, tag: str, sets: tuple[str, ...]) -> Stack:
    # Both stacks share the device: each stage gets a fifth of it (four stages, 0.8 in all) unless --set says.
    memory = ("stages.0.gpu_memory_utilization=0.2", "stages.1.gpu_memory_utilization=0.2")
    spec = StackSpec(model, a.device, a.frames, a.slots, None, None, a.threads, (*memory, *sets, *a.set))
    stack = Stack(spec, a.out / f"serve_voice_{tag}.log", env=stamps.env() if a.stamps else None)
    if not stack.start(timeout_s=a.start_timeout):
        tail = stack.tail()
        stack.stop()
        raise SystemExit(f"{model}: the stack did not start:\n{tail}")
    return stack


def cloning_arms(
    a: argparse.Namespace, stack: Stack, wav: bytes, clip: Path, wanted: list[str], result: dict[str, Any]
) -> list[Arm]:
    """The arms on the cloning model's stack: the voice uploaded, the clip inline, the x-vector upload."""
    arms = []
    if "uploaded" in wanted:
        t0 = time.perf_counter()
        voice = upload(stack.http, VOICE, wav, REF_TEXT)
        result["upload"] = {"id": voice["id"], "seconds": round(time.perf_counter() - t0, 3)}
        arms.append(Arm("uploaded", stack, ["--voice", VOICE]))
    if "inline" in wanted:
        arms.append(Arm("inline", stack, ["--voice", "", "--ref-audio", str(clip), "--ref-text", REF_TEXT]))
    if "uploaded_xvector" in wanted:
        try:
            upload(stack.http, XVECTOR_VOICE, wav, "")
        except urllib.error.HTTPError as exc:  # the family needs a transcript (Audio8)
            why = f"upload refused: {exc.code} {exc.read()[:300]!r}"
            result["arms"]["uploaded_xvector"] = {"skipped": why}
        else:
            arms.append(Arm("uploaded_xvector", stack, ["--voice", XVECTOR_VOICE]))
    return arms


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m bench.voice_library", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--model", required=True, help="a preset (or checkpoint) that clones voices")
    ap.add_argument("--builtin-model", default="", help="a preset with built-in voices; '' skips that arm")
    ap.add_argument("--builtin-voice", default=None, help="default: the family's bench voice")
    ap.add_argument("--language", default=None, help="default: the family's bench language")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--rate", type=float, default=1.0, help="Poisson arrivals per second")
    ap.add_argument("--duration", type=float, default=60.0, help="measured seconds per arm, all rounds")
    ap.add_argument(
        "--rounds", type=int, default=4, help="the arms take turns, this many rounds each (drift cancels)"
    )
    ap.add_argument("--warmup-requests", type=int, default=5)
    ap.add_argument("--frames", type=int, default=50, help="fixed length: frames per request")
    ap.add_argument("--clip-seconds", type=float, default=10.0)
    ap.add_argument("--slots", type=int, default=None, help="max_num_seqs of both stages")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--timeout", type=float, default=120.0)
    ap.add_argument("--start-timeout", type=float, default=1200.0)
    ap.add_argument("--set", action="append", default=[], help="more deploy overrides (KEY=VALUE)")
    ap.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated subset of {','.join(ARMS)}")
    ap.add_argument(
        "--stamps", action="store_true",
        help="stamp each request's way to its first audio in every process (bench/stamp_hook): per arm, "
        "each hop's p50 and mean, and each hop's difference to the built-in voice",
    )  # fmt: skip
    a = ap.parse_args(argv)
    arms_wanted = [x for x in a.arms.split(",") if x]
    unknown = sorted(set(arms_wanted) - set(ARMS))
    if unknown:
        ap.error(f"--arms: unknown arm(s) {', '.join(unknown)}; choose from {', '.join(ARMS)}")
    if a.rounds < 1:
        ap.error(f"--rounds: at least 1, got {a.rounds}")
    a.out.mkdir(parents=True, exist_ok=True)
    found = families.preset(a.model)
    bench = found[0].bench if found is not None else None
    tag = a.model.removeprefix(bench.tag_prefix) if bench is not None else Path(a.model).name
    if a.language is None:
        a.language = bench.language if bench is not None else ""
    if a.builtin_voice is None:
        builtin = families.preset(a.builtin_model) if a.builtin_model else None
        a.builtin_voice = builtin[0].bench.voice if builtin is not None and builtin[0].bench else ""
    wav = clip_wav(a.clip_seconds)
    clip = a.out / f"voice_clip_{a.clip_seconds:g}s.wav"
    clip.write_bytes(wav)
    store = a.out / f"voices_{tag}_{uuid.uuid4().hex[:8]}"
    result: dict[str, Any] = {
        "tool": "bench.voice_library", "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "model": a.model,
        "builtin_model": a.builtin_model, "device": a.device, "rate": a.rate, "duration_s": a.duration,
        "frames": a.frames, "clip_seconds": a.clip_seconds, "rounds": a.rounds, "arms": {},
    }  # fmt: skip
    stacks: list[Stack] = []
    try:
        plan: list[Arm] = []
        if set(arms_wanted) - {"builtin"}:
            stacks.append(start(a, a.model, tag, (f"gateway.voice_store_dir={store}",)))
            plan += cloning_arms(a, stacks[-1], wav, clip, arms_wanted, result)
        if a.builtin_model and "builtin" in arms_wanted:
            stacks.append(start(a, a.builtin_model, f"{tag}_builtin", ()))
            plan.append(Arm("builtin", stacks[-1], ["--voice", a.builtin_voice]))
        for arm in plan:
            warm_up(a, arm, tag)
        for index in range(a.rounds):
            for arm in plan:
                run_round(a, arm, tag, index)
    finally:
        for stack in stacks:
            stack.stop()
    arms = result["arms"]
    arms.update({arm.name: arm_result(arm, a.stamps) for arm in plan})
    values = {arm.name: ttfa_values([json.loads(f.read_text()) for f in arm.files]) for arm in plan}

    def p(arm: str, q: str) -> float | None:
        return arms.get(arm, {}).get("ttfa_ms", {}).get(q)

    result["diff_ms"] = {
        f"{x}-{y}_{q}": round(p(x, q) - p(y, q), 3)  # type: ignore[operator]
        for x, y in (("uploaded", "builtin"), ("uploaded_xvector", "builtin"), ("inline", "uploaded"))
        for q in ("p50", "mean", "p95")
        if p(x, q) is not None and p(y, q) is not None
    }
    result["diff_p50_interval_ms"] = {
        f"{x}-{y}": p50_diff_interval(values[x], values[y])
        for x, y in (("uploaded", "builtin"), ("uploaded_xvector", "builtin"), ("inline", "uploaded"))
        if values.get(x) and values.get(y)
    }
    if a.stamps and "builtin" in arms:
        result["path_diff_ms"] = {
            f"{x}-builtin": stamps.diff(arms[x]["path"], arms["builtin"]["path"])
            for x in ("uploaded", "uploaded_xvector", "inline")
            if "path" in arms.get(x, {})
        }
    path = a.out / f"voice_library_{tag}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    keys = ("diff_ms", "diff_p50_interval_ms", "path_diff_ms")
    print(json.dumps({k: result[k] for k in keys if k in result}, indent=2))
    print(f"wrote {path}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
