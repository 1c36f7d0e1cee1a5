"""The TTS codec stage's cost of taking the talker's frames in (``services.codec.worker.CodecWorker.push``).

The talker sends one frame per stream per tick; the codec's relay of each stream hands its frames to the
engine thread. Here ``--streams`` streams of a real ``CodecWorker`` and ``CodecEngine`` (a tiny preset's
decoder on the CPU, the default family's unless ``--model``) take one frame each per round, every
``--interval-ms``, each stream through a task of its own that reads its messages in order, all of a
round's messages arriving in the same turn of the event loop as a link batch delivers them; no gRPC, no
talker. ``--through relay`` (the default) has the serving ``TalkerRelay``'s reader take each message (its
checks, timers, metrics) before the worker does; ``--through worker`` hands the frames to the worker
straight. Reported: CPU-µs per frame of the event loop's thread, of the engine thread and of the process,
hand-offs to the engine thread per round, and the engine's ticks. The engine thread's and the process's
numbers also hold the decoder's own work; the loop thread's is the relay and the hand-off. Run it on two
checkouts to compare:

    PYTHONPATH=src:. python -m bench.codec_frames_in --out f.json --streams 256 --rounds 100 --interval-ms 80
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import json
import statistics
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch

from services.codec.engine import ChunkSchedule, CodecEngine, CodecOutput
from services.codec.models import CodecRuntime, load_codec
from services.codec.relay import TalkerRelay
from services.codec.upstream import TalkerPool
from services.codec.worker import CodecWorker
from voxstage import families, wire
from voxstage.config import ConnectorExtra
from voxstage.internal.v1 import stage_pb2 as S
from voxstage.presets import resolve_model


class Sink:
    """A stream's listener: counts its audio and ends."""

    def __init__(self) -> None:
        self.samples = 0
        self.errors: list[str] = []

    def on_pcm(self, output: CodecOutput) -> None:
        self.samples += output.pcm.size

    def on_engine_failed(self, message: str) -> None:
        self.errors.append(message)

    def on_request_failed(self, message: str) -> None:
        self.errors.append(message)

    def on_session_error(self, code: str, message: str) -> None:
        self.errors.append(f"{code}: {message}")


async def push(worker: CodecWorker, key: str, codes: np.ndarray) -> None:
    """The checkout's push: awaited where it is a coroutine (a cross-thread call per push)."""
    result: Any = worker.push(key, codes)
    if inspect.isawaitable(result):
        await result


class FeedCall:
    """The part of a talker call ``TalkerRelay._read`` iterates: the talker's messages, from a queue."""

    def __init__(self, inbox: asyncio.Queue[Any]) -> None:
        self.inbox = inbox

    def __aiter__(self) -> FeedCall:
        return self

    async def __anext__(self) -> Any:
        return await self.inbox.get()


class RelayedStream:
    """What a ``TalkerRelay`` reads of its ``CodecStream`` on the frames path: the stage's settings, the
    codebook, and ``frames_in`` (the stream's own, which hands the frames to the worker)."""

    def __init__(self, worker: CodecWorker, key: str, codebook_size: int) -> None:
        self.srv = SimpleNamespace(worker=worker, stream_config=ConnectorExtra(), shm_writer=None)
        self.rt = SimpleNamespace(codebook_size=codebook_size)
        self.key = key
        self.engine_open = True

    def frames_in(self, codes: np.ndarray) -> Any:
        return self.srv.worker.push(self.key, codes)  # awaited by a checkout whose push is a coroutine

    async def talker_ended(self, eos: S.EndOfStream, segment: S.SegmentDone | None) -> None:
        await self.srv.worker.finish(self.key)


def relays(
    worker: CodecWorker, pool: TalkerPool, keys: list[str], rounds: int, codebook_size: int
) -> dict[str, Any]:
    """A real ``TalkerRelay`` per stream, opened and holding credit for every round's frame."""
    out = {}
    for key in keys:
        relay = TalkerRelay(RelayedStream(worker, key, codebook_size), pool, "127.0.0.1:1", None)  # type: ignore[arg-type]
        relay.opened.set_result(S.StreamOpened())
        relay.outstanding, relay.eoi_sent = rounds, True
        out[key] = relay
    return out


def talker_frames(frames: np.ndarray) -> list[S.TalkerStreamResponse]:
    """Round r's message of any stream (the talker's ``CodecFrames`` of its r-th frame)."""
    return [
        S.TalkerStreamResponse(
            frames=S.CodecFrames(
                first_frame=r, frame_count=1, num_groups=frames.shape[1], sent_unix_ns=time.time_ns(),
                codes=S.Payload(inline=wire.codes_to_bytes(frames[r : r + 1])),
            )
        )
        for r in range(frames.shape[0])
    ]  # fmt: skip


async def run(
    runtime: CodecRuntime, streams: int, rounds: int, interval_s: float, through: str
) -> dict[str, Any]:
    engine = CodecEngine(
        runtime.decoder, max_streams=streams, schedule=ChunkSchedule(initial_frames=1, steady_frames=25),
        num_groups=runtime.num_groups, codebook_size=runtime.codebook_size, sample_rate=runtime.sample_rate,
        async_scheduling=True,
    )  # fmt: skip
    worker = CodecWorker(None, engine)  # type: ignore[arg-type]  # no warm-up, no reference encodes
    worker.start(asyncio.get_running_loop())
    handoffs = [0]
    real_call = worker._thread.call  # noqa: SLF001 - counted, not changed

    def counted(fn: Any) -> Any:
        handoffs[0] += 1
        return real_call(fn)

    worker._thread.call = counted  # type: ignore[method-assign]  # noqa: SLF001
    sinks = {f"s{i}": Sink() for i in range(streams)}
    for key, sink in sinks.items():
        await worker.open(key, initial_frames=1, prefix=None, listener=sink)
    groups, size = runtime.num_groups, runtime.codebook_size
    frames = np.random.default_rng(0).integers(0, size, (rounds, groups), dtype=np.int64)
    inbox = {key: asyncio.Queue[Any]() for key in sinks}
    pool = TalkerPool(None)  # its channel to the (absent) talker is never dialled; closed at the end
    relayed = relays(worker, pool, list(sinks), rounds, size) if through == "relay" else {}
    messages: list[Any] = talker_frames(frames) if relayed else [frames[r : r + 1] for r in range(rounds)]

    async def relay(key: str) -> None:  # one stream's relay: takes its messages in order, pushes each
        if relayed:  # the serving relay's reader
            relayed[key].call = FeedCall(inbox[key])
            await relayed[key]._read()  # noqa: SLF001 - its reader, fed from the inbox
            return
        for _ in range(rounds):
            await push(worker, key, await inbox[key].get())

    tasks = [asyncio.create_task(relay(key)) for key in sinks]
    await asyncio.sleep(0.05)
    engine_cpu0 = await worker._call(time.thread_time)  # noqa: SLF001 - the engine thread's own clock
    loop_cpu0, proc_cpu0, wall0, ticks0, hand0 = (
        time.thread_time(),
        time.process_time(),
        time.perf_counter(),
        engine.ticks,
        handoffs[0],
    )
    for r in range(rounds):  # a link batch: every stream's frame of the talker's tick at once
        for queue in inbox.values():
            queue.put_nowait(messages[r])
        await asyncio.sleep(interval_s)
    if relayed:  # the talker's end of each stream: the relay finishes it
        end = S.TalkerStreamResponse(end_of_stream=S.EndOfStream(reason=S.END_REASON_MAX_FRAMES))
        for queue in inbox.values():
            queue.put_nowait(end)
    await asyncio.gather(*tasks)
    # The engine's clock first (its call waits for the tick under way), then the others at that moment.
    engine_cpu = await worker._call(time.thread_time) - engine_cpu0  # noqa: SLF001
    loop_cpu, proc_cpu = time.thread_time() - loop_cpu0, time.process_time() - proc_cpu0
    wall = time.perf_counter() - wall0
    # Less the engine clock's own call and, through the relay, each stream's finish at its end of stream.
    hand = handoffs[0] - hand0 - 1 - (streams if relayed else 0)
    if not relayed:
        for key in sinks:
            await worker.finish(key)
    await asyncio.sleep(0.5)
    await pool.close()
    worker.stop()
    pushed = streams * rounds
    errors = [e for s in sinks.values() for e in s.errors]
    return {
        "through": through,
        "streams": streams,
        "rounds": rounds,
        "interval_ms": 1e3 * interval_s,
        "wall_s": round(wall, 3),
        "loop_cpu_us_per_frame": round(1e6 * loop_cpu / pushed, 2),
        "engine_cpu_us_per_frame": round(1e6 * engine_cpu / pushed, 2),
        "process_cpu_us_per_frame": round(1e6 * proc_cpu / pushed, 2),
        "handoffs_per_round": round(hand / rounds, 2),
        "engine_ticks": engine.ticks - ticks0,
        "audio_samples": sum(s.samples for s in sinks.values()),
        "samples_per_frame": runtime.samples_per_frame,
        "errors": errors[:3],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--model", default=None, help="a tiny preset (default: the default family's demo model)")
    ap.add_argument("--streams", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=150)
    ap.add_argument("--interval-ms", type=float, default=20.0, help="between rounds (a talker tick)")
    ap.add_argument("--repeats", type=int, default=3, help="runs; the loop thread's best is reported")
    ap.add_argument(
        "--through", choices=("relay", "worker"), default="relay",
        help="relay: the serving TalkerRelay's reader takes each message (checks, timers, hand-off); worker: "
        "the frames go straight to CodecWorker.push",
    )  # fmt: skip
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    model = a.model or families.default_family().demo[0]
    runs = []
    for _ in range(a.repeats):  # a fresh decoder pool each run: no state carried from the last
        runtime = load_codec(resolve_model(model), device="cpu", max_streams=a.streams)
        runs.append(asyncio.run(run(runtime, a.streams, a.rounds, a.interval_ms / 1e3, a.through)))
    best = min(runs, key=lambda r: r["loop_cpu_us_per_frame"])
    out = {
        "tool": "bench.codec_frames_in",
        "model": model,
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "best": best,
        "median_loop_cpu_us_per_frame": statistics.median(r["loop_cpu_us_per_frame"] for r in runs),
        "median_process_cpu_us_per_frame": statistics.median(r["process_cpu_us_per_frame"] for r in runs),
        "runs": runs,
    }
    a.out.write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps({k: v for k, v in out.items() if k != "runs"}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
