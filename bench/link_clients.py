"""``bench/link_transport.py --shape clients``: duplex sessions as clients really send, each on its own clock.

In the ``duplex`` shape every session's frame is written in one loop pass, so the link batches them for
free. Real clients send their frames at their own phase within the 80 ms, so the gateway's end of the link
sees one frame at a time: session ``i`` sends at ``i / sessions`` of each tick here. The server answers as
a codec does, at its own 80 ms tick: every frame that came in since the last tick gets its PCM frame and a
credit then, all in one batch. Reported per level: each end's CPU, the gateway end's batches per user frame,
and each frame's round trip (its send to its answer's arrival: up to a tick by construction, plus what the
link adds). ``--linger-ms`` sets the gateway end's user-audio linger (``voxstage.link.port``) for an A/B.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import grpc
import numpy as np

from bench.link_transport import FRAME, EchoCodec
from voxstage.internal.v1 import stage_pb2 as S
from voxstage.internal.v1 import stage_pb2_grpc
from voxstage.link.client import LinkClient
from voxstage.link.wire import CODEC_REQUESTS, CODEC_RESPONSES
from voxstage.server import CHANNEL_OPTIONS

TICK_S = 0.08


class TickedCodec(EchoCodec):
    """Per user frame one PCM frame and one credit back, at the server's next 80 ms tick."""

    def __init__(self) -> None:
        super().__init__()
        self.tick = asyncio.Event()
        self._ticker: asyncio.Task[None] | None = None

    async def _run_ticks(self) -> None:
        start = time.perf_counter()
        k = 0
        while True:
            k += 1
            await asyncio.sleep(max(0.0, start + k * TICK_S - time.perf_counter()))
            self.tick.set()  # every handler with a frame waiting wakes in this one loop turn
            self.tick = asyncio.Event()

    async def before_reply(self) -> None:
        if self._ticker is None:
            self._ticker = asyncio.ensure_future(self._run_ticks())
        await self.tick.wait()


async def clients_level(
    address: str, sessions: int, seconds: float, server_pid: int, *, cpu_s: Callable[[int], float]
) -> dict[str, Any]:
    channel = grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS)
    link = LinkClient("codec", stage_pb2_grpc.CodecStub(channel).Link, CODEC_REQUESTS, CODEC_RESPONSES)
    calls = [link.stream() for _ in range(sessions)]
    ticks = int(seconds / TICK_S)
    sent_at = np.zeros((sessions, ticks))
    trips: list[float] = []
    pcm = np.zeros(FRAME, "<f4").tobytes()

    async def reader(i: int) -> None:
        async for msg in calls[i]:
            if msg.HasField("pcm"):
                trips.append(time.perf_counter() - sent_at[i, msg.pcm.user_frame])
            elif msg.HasField("end_of_stream"):
                return

    async def client(i: int, t0: float) -> None:
        for k in range(ticks):
            await asyncio.sleep(max(0.0, t0 + (k + i / sessions) * TICK_S - time.perf_counter()))
            chunk = S.PcmChunk(sample_offset=k * FRAME, sample_count=FRAME, format=S.PCM_FORMAT_F32LE)
            chunk.data.inline = pcm
            sent_at[i, k] = time.perf_counter()
            await calls[i].write(S.CodecStreamRequest(user_audio=chunk))

    for i, call in enumerate(calls):
        await call.write(S.CodecStreamRequest(open=S.StreamOpen(request_id=f"s{i}")))
    readers = [asyncio.ensure_future(reader(i)) for i in range(sessions)]
    await asyncio.sleep(0.5)
    assert link._conn is not None
    batches0 = link._conn.port.batches
    t_cpu, s_cpu, t0 = time.process_time(), cpu_s(server_pid), time.perf_counter()
    await asyncio.gather(*(client(i, t0) for i in range(sessions)))
    await asyncio.sleep(2 * TICK_S)  # the last frames' answers
    wall = time.perf_counter() - t0
    client_cpu, server_cpu = time.process_time() - t_cpu, cpu_s(server_pid) - s_cpu
    batches = link._conn.port.batches - batches0
    for call in calls:
        await call.write(S.CodecStreamRequest(end_of_input=S.EndOfInput()))
        await call.done_writing()
    await asyncio.wait_for(asyncio.gather(*readers), 30)
    link.close()
    await channel.close()
    session_ticks = sessions * ticks
    ms = np.array(trips) * 1000
    return {
        "mode": "link",
        "clocks": "per client",
        "sessions": sessions,
        "ticks": ticks,
        "wall_s": wall,
        "frames_answered": len(trips),
        "client_cpu_ms_per_s": 1000 * client_cpu / wall,
        "server_cpu_ms_per_s": 1000 * server_cpu / wall,
        "client_cpu_us_per_session_tick": 1e6 * client_cpu / session_ticks,
        "server_cpu_us_per_session_tick": 1e6 * server_cpu / session_ticks,
        # Batches the client end (the gateway's) sent, user frames and credits alike, per user frame.
        "client_batches_per_user_frame": batches / session_ticks,
        "round_trip_ms": {
            "p50": float(np.percentile(ms, 50)),
            "p99": float(np.percentile(ms, 99)),
            "max": float(ms.max()),
        },
    }
