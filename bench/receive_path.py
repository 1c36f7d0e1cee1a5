"""The gateway's per-message cost of taking the codec's messages (``gateway.upstream.CodecStream``), alone.

A duplex session takes two messages from the codec every 80 ms (the agent frame and the user-audio credit),
each through the serving class's reader and ``next_event``. Here ``--sessions`` duplex streams of the real
``DuplexCodecStream`` read from in-memory calls that a ticker fills with one PCM frame and one credit per
session per round, all sessions at once as a link batch delivers them; no gRPC, no codec. Reported: CPU-µs
per message of this process, best of ``--repeats``. Run it on two checkouts to compare their receive paths:

    PYTHONPATH=src:. python -m bench.receive_path --out receive.json --sessions 64 --rounds 400
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path
from typing import Any

import grpc

from gateway.duplex.upstream import AgentPcm, DuplexCodecStream
from gateway.upstream import Timeouts
from voxstage.internal.v1 import stage_pb2 as S

FRAME = 1920


class MemoryCall:
    """The part of a ``grpc.aio`` bidi call ``CodecStream`` uses, in memory (also the receive path's unit
    tests' call: tests/unit/gateway/test_upstream_receive.py)."""

    def __init__(self) -> None:
        self.inbox: asyncio.Queue[Any] = asyncio.Queue()
        self.written: list[Any] = []

    async def write(self, msg: Any) -> None:
        self.written.append(msg)

    async def done_writing(self) -> None:
        pass

    async def read(self) -> Any:
        return await self.inbox.get()

    def done(self) -> bool:
        return False

    def cancel(self) -> bool:
        return True


class Replica:
    address = "memory"
    status = None

    def __init__(self) -> None:
        self.calls: list[MemoryCall] = []

    def codec_link(self, reader: Any) -> None:
        return None  # a call of its own per stream: the in-memory one

    @property
    def codec_stub(self) -> Any:
        return self

    def Stream(self, timeout: float | None = None) -> MemoryCall:  # noqa: N802
        self.calls.append(MemoryCall())
        return self.calls[-1]


async def run(sessions: int, rounds: int) -> float:
    replica = Replica()
    timeouts = Timeouts(first_chunk_s=30.0, stall_s=30.0)
    streams = [DuplexCodecStream(None, replica, timeouts=timeouts) for _ in range(sessions)]  # type: ignore[arg-type]
    opened = S.CodecStreamResponse(
        opened=S.StreamOpened(initial_credit=S.Credit(unit=S.CREDIT_UNIT_SAMPLES, amount=4 * FRAME))
    )
    for stream, call in zip(streams, replica.calls, strict=True):
        call.inbox.put_nowait(opened)
        await stream.open_duplex(S.StreamOpen(initial_credit=S.Credit(amount=64 * FRAME)))
    pcm = S.PcmChunk(sample_count=FRAME, format=S.PCM_FORMAT_F32LE)
    pcm.data.inline = bytes(4 * FRAME)
    frame = S.CodecStreamResponse(pcm=pcm)
    credit = S.CodecStreamResponse(credit=S.Credit(unit=S.CREDIT_UNIT_SAMPLES, amount=FRAME))
    taken = 0
    round_done = asyncio.Event()

    async def session(i: int) -> None:
        nonlocal taken
        stream = streams[i]
        while True:
            event = await stream.next_event()
            assert isinstance(event, AgentPcm)
            stream._credit_left += FRAME  # noqa: SLF001 - as the grant after the client's send would
            taken += 1
            if taken % sessions == 0:
                round_done.set()

    tasks = [asyncio.ensure_future(session(i)) for i in range(sessions)]
    await asyncio.sleep(0)
    start = time.process_time()
    for _ in range(rounds):
        round_done.clear()
        for call in replica.calls:
            call.inbox.put_nowait(frame)
            call.inbox.put_nowait(credit)
        await asyncio.wait_for(round_done.wait(), 10)
    cpu = time.process_time() - start
    for task in tasks:
        task.cancel()
    for stream in streams:
        stream._terminal_seen = True  # noqa: SLF001 - nothing to tear down in memory
        stream.close()
    return 1e6 * cpu / (2 * sessions * rounds)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--sessions", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=400)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    runs = [asyncio.run(run(args.sessions, args.rounds)) for _ in range(args.repeats)]
    doc = {
        "bench": "receive_path",
        "sessions": args.sessions,
        "rounds": args.rounds,
        "us_per_message": runs,
        "best_us_per_message": min(runs),
        "grpc": grpc.__version__,
    }
    Path(args.out).write_text(json.dumps(doc, indent=1))
    print(json.dumps(doc))


if __name__ == "__main__":
    main()
