"""Duplex load generator (issue 12): N concurrent full-duplex sessions through the gateway, each streaming
real-time user audio, at several levels of N.

Each session opens gRPC ``Converse``, sets its voice and persona with ``session.update``, then sends one
80 ms frame of 24 kHz pcm16 every 80 ms on an absolute schedule for ``--seconds``, and records the agent
audio deltas and transcript deltas it receives. Per level it reports:

* client side: agent audio received (seconds per session second), time to the first agent audio, and
  **late frames** as a listener hears them: playback starts with the first agent frame and plays 80 ms per
  frame; a frame that arrives after its play time is late (the player stalls; later frames shift);
* server side (Prometheus, diffed over the level): tick time p50/p99 of the talker and the codec
  (``voxstage_stage_tick_seconds``), the codec's late frames (agent PCM that left after its tick's 80 ms
  deadline) and input underflow ticks, and the gateway's time from a user frame arriving to the agent audio
  that answered it.

    python bench/duplex_loadgen.py --out duplex.json --device cuda --levels 1,8,32,64   # the size-true preset
    python bench/duplex_loadgen.py --out smoke.json --model TINY_PRESET --device cpu --levels 1,2 --seconds 3

The model and deploy file default to the duplex family's (``voxstage.families``): its size-true preset and
its seed deploy file.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import numpy as np

from bench.stack import Stack, StackSpec
from voxstage import families
from voxstage.v1 import speech_pb2 as P
from voxstage.v1 import speech_pb2_grpc

RATE = 24000
FRAME = 1920  # samples per 80 ms
TICK = 0.08
DUPLEX = next(f for f in families.families() if f.duplex)
DEPLOY = Path(__file__).resolve().parents[1] / DUPLEX.deploy_file


@dataclass
class SessionRecord:
    started: float
    opened_at: float | None = None
    audio: list[tuple[float, int]] = field(default_factory=list)  # (arrival, samples)
    transcript: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    frames_sent: int = 0

    def summary(self) -> dict[str, Any]:
        if not self.audio:
            return {"frames": 0, "late": 0, "errors": self.errors}
        first = self.audio[0][0]
        late = 0
        shift = 0.0
        played = 0
        for arrival, samples in self.audio:
            due = first + shift + played / RATE
            if arrival > due + 1e-3:
                late += 1
                shift += arrival - due
            played += samples
        return {
            "frames": int(played // FRAME),
            "late": late,
            "first_audio_s": first - self.started,
            "stall_s": shift,
            "transcript_chars": sum(len(t) for t in self.transcript),
            "errors": self.errors,
        }


def user_audio(seconds: float, seed: int) -> bytes:
    """A voiced-ish signal (a wandering tone plus noise) at -20 dBFS, pcm16."""
    t = np.arange(int(seconds * RATE)) / RATE
    f0 = 140 + 30 * np.sin(2 * np.pi * 0.3 * t + seed)
    x = 0.1 * np.sin(2 * np.pi * np.cumsum(f0) / RATE) + 0.01 * np.random.default_rng(seed).standard_normal(
        t.size
    )
    return (np.clip(x, -1, 1) * 32767).astype("<i2").tobytes()


async def session(target: str, seconds: float, seed: int, voice: str, persona: str) -> SessionRecord:
    rec = SessionRecord(time.perf_counter())
    audio = user_audio(seconds, seed)
    pcm = P.RealtimeAudioFormat(encoding=P.AUDIO_ENCODING_PCM_S16LE, sample_rate_hz=RATE)
    update = P.Session(
        instructions=persona,
        audio=P.SessionAudio(
            input=P.SessionAudioInput(format=pcm), output=P.SessionAudioOutput(format=pcm, voice=voice)
        ),
        seed=seed,
    )

    async def requests():  # type: ignore[no-untyped-def]
        yield P.ConverseRequest(session_update=P.SessionUpdate(session=update))
        t0 = time.perf_counter()
        for k in range(len(audio) // (2 * FRAME)):
            delay = t0 + k * TICK - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            chunk = audio[2 * FRAME * k : 2 * FRAME * (k + 1)]
            yield P.ConverseRequest(input_audio_buffer_append=P.InputAudioBufferAppend(audio=chunk))
            rec.frames_sent += 1
        await asyncio.sleep(0.5)  # let the last answers arrive before closing

    async with grpc.aio.insecure_channel(target) as channel:
        call = speech_pb2_grpc.SpeechStub(channel).Converse(requests(), timeout=seconds + 120)
        try:
            async for event in call:
                kind = event.WhichOneof("event")
                now = time.perf_counter()
                if kind == "response_output_audio_delta":
                    rec.audio.append((now, len(event.response_output_audio_delta.delta) // 2))
                elif kind == "response_output_audio_transcript_delta":
                    rec.transcript.append(event.response_output_audio_transcript_delta.delta)
                elif kind == "session_updated":
                    rec.opened_at = now
                elif kind == "error":
                    rec.errors.append(f"{event.error.code}: {event.error.message}")
        except grpc.aio.AioRpcError as exc:
            rec.errors.append(f"{exc.code().name}: {exc.details()}")
    return rec


async def level(target: str, n: int, seconds: float, voice: str, persona: str) -> list[SessionRecord]:
    async def staggered(i: int) -> SessionRecord:
        await asyncio.sleep(i * min(1.0, 4.0 / max(n, 1)) / max(n, 1))  # joins spread over <= 1 s
        return await session(target, seconds, 1000 + i, voice, persona)

    return list(await asyncio.gather(*(staggered(i) for i in range(n))))


# -- Prometheus text ---------------------------------------------------------------------------------------
def parse_prom(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            try:
                out[key] = float(value)
            except ValueError:
                continue
    return out


def diff(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    return {k: v - before.get(k, 0.0) for k, v in after.items()}


def hist_quantiles(d: dict[str, float], name: str, labels: str = "") -> dict[str, float | None]:
    """p50/p99 from a histogram's bucket diffs (upper bucket bounds, as Prometheus estimates them)."""
    buckets = []
    for key, count in d.items():
        if key.startswith(name + "_bucket{") and labels in key:
            le = key.split('le="')[1].split('"')[0]
            buckets.append((math.inf if le == "+Inf" else float(le), count))
    buckets.sort()
    total = buckets[-1][1] if buckets else 0
    result: dict[str, float | None] = {"count": total}
    for q in (0.5, 0.99):
        bound = next((le for le, c in buckets if total and c >= q * total), None)
        result[f"p{round(q * 100)}"] = bound
    return result


def counter(d: dict[str, float], name: str) -> float:
    return sum(v for k, v in d.items() if k == name + "_total" or k.startswith(name + "_total{"))


def scrape(stack: Stack, tag: str, folder: Path) -> dict[str, dict[str, float]]:
    stack.scrape(folder / tag)
    return {p: parse_prom((folder / f"{tag}_{p}.prom").read_text()) for p in ("gateway", "codec", "talker")}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--model", default=next(p.name for p in DUPLEX.presets if p.random_init))
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--levels", default="1,8,32,64")
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--voice", default="NATF0")
    parser.add_argument("--persona", default="You enjoy having a good conversation.")
    parser.add_argument("--set", action="append", default=[], help="extra deploy overrides")
    args = parser.parse_args()
    levels = [int(x) for x in args.levels.split(",")]
    top = max(levels)
    sets = (f"duplex_session.max_sessions={top}", *args.set)
    spec = StackSpec(args.model, device=args.device, frames=None, slots=top, deploy=DEPLOY, extra_sets=sets)
    folder = args.out.with_suffix("")
    folder.mkdir(parents=True, exist_ok=True)
    stack = Stack(spec, folder / "stack.log")
    result: dict[str, Any] = {
        "model": args.model,
        "device": args.device,
        "seconds": args.seconds,
        "levels": [],
    }
    if not stack.start():
        raise SystemExit(f"stack did not start:\n{stack.tail()}")
    result["start_s"] = stack.start_s
    try:
        for n in levels:
            before = scrape(stack, f"before_{n}", folder)
            t0 = time.perf_counter()
            records = asyncio.run(level(stack.grpc, n, args.seconds, args.voice, args.persona))
            wall = time.perf_counter() - t0
            after = scrape(stack, f"after_{n}", folder)
            d = {p: diff(after[p], before[p]) for p in after}
            sessions = [r.summary() for r in records]
            frames = sum(s["frames"] for s in sessions)
            late = sum(s["late"] for s in sessions)
            row = {
                "sessions": n,
                "wall_s": wall,
                "errors": sum(len(s["errors"]) for s in sessions),
                "agent_frames": frames,
                "client_late_frames": late,
                "client_late_rate": late / frames if frames else None,
                "first_audio_s_max": max((s.get("first_audio_s", 0.0) for s in sessions), default=None),
                "talker_tick": hist_quantiles(d["talker"], "voxstage_stage_tick_seconds", 'stage="talker"'),
                "codec_tick": hist_quantiles(d["codec"], "voxstage_stage_tick_seconds", 'stage="codec"'),
                "codec_late_frames": counter(d["codec"], "voxstage_duplex_late_frames"),
                "codec_underflow_ticks": counter(d["codec"], "voxstage_duplex_input_underflow_ticks"),
                "response_latency": hist_quantiles(d["gateway"], "voxstage_duplex_response_latency_seconds"),
                "per_session": sessions,
            }
            result["levels"].append(row)
            print(json.dumps({k: v for k, v in row.items() if k != "per_session"}), flush=True)
            args.out.write_text(json.dumps(result, indent=2) + "\n")
    finally:
        stack.stop()
    args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
