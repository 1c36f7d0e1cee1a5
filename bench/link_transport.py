"""What a stage hop's messages cost its two ends: a call per request vs one link (issues 27 and 28).

No model runs, so the number is the transport's alone, and CPU time (not wall time) is measured, so it holds
on a busy machine. A server process answers every session's ``user_audio`` (one 80 ms frame, f32) with one
``pcm`` frame and one ``credit``, as the codec does at every tick; the client sends every session's frame
each 80 ms and reads the answers. ``stream``: each session is its own ``Codec.Stream`` call (the path before
issue 27); ``link``: every session rides one ``Codec.Link`` call (``voxstage.link``), the same per-request
handler behind it. Reported per mode: CPU-ms per second of each process, CPU-µs per session-tick, gRPC
messages (stream) or link batches per second, and ticks that finished within their 80 ms.

``--shape clients`` sends each session's frames on a clock of its own, as real clients do, to a server
that answers at its own 80 ms tick (``bench/link_clients.py``); ``--linger-ms`` sets the gateway end's
user-audio linger for an A/B.

``--shape tts`` measures a text-to-speech request's hop instead (``bench/link_tts.py``: the chunk schedule's
192 KB PCM chunks every 2 s per stream with credits, acks and the requests' opens and ends, through shared
memory as on one host); ``--sessions`` are then concurrent streams.

    python -m bench.link_transport --out link.json --sessions 16,64,128 --seconds 10
    python -m bench.link_transport --shape tts --out tts.json --sessions 64,128,256 --seconds 10
    python -m bench.link_transport --shape clients --out clients.json --sessions 16,64,128 --linger-ms 0
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np

from voxstage.internal.v1 import stage_pb2 as S
from voxstage.internal.v1 import stage_pb2_grpc
from voxstage.link.client import LinkClient
from voxstage.link.server import LinkSession
from voxstage.link.wire import CODEC_REQUESTS, CODEC_RESPONSES
from voxstage.server import CHANNEL_OPTIONS, SERVER_OPTIONS
from voxstage.transport.shm import ShmWriter

FRAME = 1920
TICK_S = 0.08


class EchoCodec(stage_pb2_grpc.CodecServicer):
    """A codec's message pattern without its model: per user frame, one PCM frame and one credit back."""

    def __init__(self) -> None:
        self.pcm = np.zeros(FRAME, "<f4").tobytes()

    async def before_reply(self) -> None:
        """When a user frame's reply may go (at once here; a subclass may hold it)."""

    async def Status(self, request: Any, context: Any) -> S.CodecStatusResponse:  # noqa: N802
        return S.CodecStatusResponse(status=S.StageStatus(ready=True, link=True))

    async def Stream(  # noqa: N802
        self, requests: AsyncIterator[S.CodecStreamRequest], context: Any
    ) -> AsyncIterator[S.CodecStreamResponse]:
        sent = 0
        async for msg in requests:
            kind = msg.WhichOneof("request")
            if kind == "open":
                yield S.CodecStreamResponse(opened=S.StreamOpened(request_id=msg.open.request_id))
            elif kind == "user_audio":
                await self.before_reply()
                chunk = S.PcmChunk(
                    sample_offset=sent * FRAME,
                    sample_count=FRAME,
                    format=S.PCM_FORMAT_F32LE,
                    first_frame=sent,
                    frame_count=1,
                    user_frame=msg.user_audio.sample_offset // FRAME,
                    sent_unix_ns=time.time_ns(),
                )
                chunk.data.inline = self.pcm
                sent += 1
                yield S.CodecStreamResponse(pcm=chunk)
                yield S.CodecStreamResponse(credit=S.Credit(unit=S.CREDIT_UNIT_SAMPLES, amount=FRAME))
            elif kind == "end_of_input":
                yield S.CodecStreamResponse(end_of_stream=S.EndOfStream(reason=S.END_REASON_EOS))
                return

    async def Link(self, batches: Any, context: Any) -> AsyncIterator[Any]:  # noqa: N802
        session = LinkSession(self.Stream, CODEC_REQUESTS, CODEC_RESPONSES, writer=None, reader=None)
        out = session.run(batches)
        try:
            async for batch in out:
                yield batch
        except asyncio.CancelledError:
            pass
        finally:
            await out.aclose()


def _serve(port: mp.Value, shape: str, chunk_frames: int, chunks: int, shm: bool) -> None:  # type: ignore[valid-type]
    async def main() -> None:
        server = grpc.aio.server(options=SERVER_OPTIONS)
        if shape == "tts":
            from bench.link_tts import SEED_SHM_THRESHOLD, TtsCodec

            writer = ShmWriter(threshold_bytes=SEED_SHM_THRESHOLD) if shm else None
            servicer: Any = TtsCodec(writer, chunk_frames, chunks)
        elif shape == "clients":
            from bench.link_clients import TickedCodec

            servicer = TickedCodec()
        else:
            servicer = EchoCodec()
        stage_pb2_grpc.add_CodecServicer_to_server(servicer, server)
        port.value = server.add_insecure_port("127.0.0.1:0")  # type: ignore[attr-defined]
        await server.start()
        await server.wait_for_termination()

    asyncio.run(main())


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _level(address: str, sessions: int, seconds: float, mode: str, server_pid: int) -> dict[str, Any]:
    channel = grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS)
    stub = stage_pb2_grpc.CodecStub(channel)
    link = LinkClient("codec", stub.Link, CODEC_REQUESTS, CODEC_RESPONSES) if mode == "link" else None
    calls = [stub.Stream() if link is None else link.stream() for _ in range(sessions)]
    got = [0] * sessions
    progress = asyncio.Event()
    pcm = np.zeros(FRAME, "<f4").tobytes()

    async def reader(i: int) -> None:
        async for msg in calls[i]:
            if msg.HasField("pcm"):
                got[i] += 1
                progress.set()
            elif msg.HasField("end_of_stream"):
                return

    for i, call in enumerate(calls):
        await call.write(S.CodecStreamRequest(open=S.StreamOpen(request_id=f"s{i}")))
    readers = [asyncio.ensure_future(reader(i)) for i in range(sessions)]
    await asyncio.sleep(0.5)
    ticks = int(seconds / TICK_S)
    on_time = 0
    t_cpu, s_cpu, t0 = time.process_time(), _cpu_s(server_pid), time.perf_counter()
    for k in range(ticks):
        await asyncio.sleep(max(0.0, t0 + k * TICK_S - time.perf_counter()))
        for call in calls:
            chunk = S.PcmChunk(sample_offset=k * FRAME, sample_count=FRAME, format=S.PCM_FORMAT_F32LE)
            chunk.data.inline = pcm
            await call.write(S.CodecStreamRequest(user_audio=chunk))
        want, deadline = k + 1, t0 + (k + 1) * TICK_S
        while min(got) < want:
            progress.clear()
            try:
                await asyncio.wait_for(progress.wait(), max(0.0, deadline - time.perf_counter()))
            except TimeoutError:
                break
        on_time += min(got) >= want
    wall = time.perf_counter() - t0
    client_cpu, server_cpu = time.process_time() - t_cpu, _cpu_s(server_pid) - s_cpu
    for call in calls:
        await call.write(S.CodecStreamRequest(end_of_input=S.EndOfInput()))
        await call.done_writing()
    await asyncio.wait_for(asyncio.gather(*readers), 30)
    batches = link._conn.port.batches if link is not None and link._conn is not None else None
    if link is not None:
        link.close()
    await channel.close()
    session_ticks = sessions * ticks
    return {
        "mode": mode,
        "sessions": sessions,
        "ticks": ticks,
        "wall_s": wall,
        "ticks_on_time": on_time,
        "frames_answered": sum(got),
        "client_cpu_ms_per_s": 1000 * client_cpu / wall,
        "server_cpu_ms_per_s": 1000 * server_cpu / wall,
        "client_cpu_us_per_session_tick": 1e6 * client_cpu / session_ticks,
        "server_cpu_us_per_session_tick": 1e6 * server_cpu / session_ticks,
        # Each way per tick: user_audio in; pcm and credit out (one gRPC message each on a call of its own).
        "grpc_messages_per_s": (3 * session_ticks if mode == "stream" else None) and 3 * session_ticks / wall,
        "client_link_batches_per_s": None if batches is None else batches / wall,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--sessions", default="16,64,128")
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--modes", default="stream,link")
    ap.add_argument("--shape", choices=("duplex", "tts", "clients"), default="duplex")
    ap.add_argument("--chunk-frames", type=int, default=25, help="tts: frames of a steady chunk (25: 2 s)")
    ap.add_argument("--chunks", type=int, default=5, help="tts: steady chunks of a request, then the next")
    ap.add_argument("--no-shm", action="store_true", help="tts: everything inline (hosts apart)")
    ap.add_argument("--linger-ms", type=float, default=None, help="clients: the user-audio linger (ms)")
    args = ap.parse_args()
    if args.linger_ms is not None:
        from voxstage.link import port as link_port

        link_port.USER_AUDIO_LINGER_S = args.linger_ms / 1000
    port = mp.Value("i", 0)
    shm = not args.no_shm
    server = mp.Process(
        target=_serve, args=(port, args.shape, args.chunk_frames, args.chunks, shm), daemon=True
    )
    server.start()
    try:
        while not port.value:
            time.sleep(0.05)
        address = f"127.0.0.1:{port.value}"
        assert server.pid is not None
        pid = server.pid

        async def levels() -> list[dict[str, Any]]:
            # One event loop for every level: grpc.aio keeps its poller on the loop it first ran on.
            rows = []
            for n in (int(x) for x in args.sessions.split(",")):
                for mode in args.modes.split(","):
                    if args.shape == "tts":
                        from bench.link_tts import tts_level

                        row = await tts_level(
                            address, n, args.seconds, mode, pid, chunks=args.chunks, shm=shm, cpu_s=_cpu_s
                        )
                    elif args.shape == "clients":
                        from bench.link_clients import clients_level

                        if mode != "link":
                            continue  # the linger is the link's
                        row = await clients_level(address, n, args.seconds, pid, cpu_s=_cpu_s)
                    else:
                        row = await _level(address, n, args.seconds, mode, pid)
                    rows.append(row)
                    print(json.dumps(row), flush=True)
            return rows

        rows = asyncio.run(levels())
        out = {
            "bench": "link_transport",
            "shape": args.shape,
            "cpus": os.cpu_count(),
            "seconds": args.seconds,
            "levels": rows,
        }
        if args.shape == "tts":
            out.update(chunk_frames=args.chunk_frames, chunks=args.chunks, shm=shm)
        if args.shape == "clients":
            from voxstage.link import port as link_port

            out.update(linger_ms=link_port.USER_AUDIO_LINGER_S * 1000)
        Path(args.out).write_text(json.dumps(out, indent=1))
    finally:
        server.terminate()
        server.join(5)


if __name__ == "__main__":
    main()
