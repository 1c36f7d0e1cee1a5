"""The text-to-speech shape of ``bench/link_transport.py`` (``--shape tts``): a call per request vs one link.

A TTS request's hop from the codec to the gateway, without a model, with the product's message mix and the
shared memory one host uses: the client (the gateway's end) opens each request with ``open``, text and
``end_of_input``; the server (the codec's end) answers ``opened``, then from one 80 ms ticker, as the codec's
engine hands a tick's audio to its event loop in one callback, a 1-frame first chunk at the next tick and a
steady chunk of ``--chunk-frames`` frames (25: 2 s of f32 PCM, 192 KB) every ``chunk-frames`` ticks, within
the request's sample credit; after ``--chunks`` steady chunks, ``segment_done`` and ``end_of_stream``. The
client reads each chunk, acks it when it came in shared memory and grants its samples back, and at the end
of a request opens the next one in its place. Requests start staggered over the first 25 ticks, so chunks
spread over the ticks as a steady load does; the measurement starts once every stream has started.

``stream``: a ``Codec.Stream`` call per request; with shared memory (the default, the seeds' 64 KiB
threshold) each chunk above it is a slot of its own, acked by an ``shm_ack`` message. ``link``: every
request on one ``Codec.Link`` (``voxstage.link``), the same handler behind it; a tick's chunks go as one
slab, in shared memory above the threshold, acked in the next batch. Reported per mode: CPU-ms per second of
each process and CPU-µs per chunk, chunks/s and MB/s delivered, requests finished, gRPC messages/s (stream)
or the client's link batches/s (link), and each chunk's delivery time (server send to client read) at p50
and p99 (wall-clock: only meaningful on an idle machine).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import grpc
import numpy as np

from voxstage.internal.v1 import stage_pb2 as S
from voxstage.internal.v1 import stage_pb2_grpc
from voxstage.link.client import LinkClient
from voxstage.link.server import LinkContext, LinkSession
from voxstage.link.wire import CODEC_REQUESTS, CODEC_RESPONSES
from voxstage.server import CHANNEL_OPTIONS
from voxstage.transport.host import local_hello, verify_peer
from voxstage.transport.payload import (
    ack_message,
    acked_refs,
    hello_from_proto,
    hello_to_proto,
    read_payload,
    to_payload,
)
from voxstage.transport.shm import ShmSender, ShmWriter
from voxstage.transport.shm_reader import ShmReader

FRAME = 1920
TICK_S = 0.08
SEED_SHM_THRESHOLD = 64 * 1024
WINDOW_FRAMES = 51  # the gateway's window: a first chunk and two steady ones


@dataclass
class _Request:
    credit: int
    sender: ShmSender | None
    due: int  # the tick of the next chunk
    steady_left: int
    out: asyncio.Queue[Any] = field(default_factory=asyncio.Queue)
    sent: int = 0  # samples
    started: bool = False


class TtsCodec(stage_pb2_grpc.CodecServicer):
    """A codec's TTS message pattern without its model: chunks on the chunk schedule, from one ticker."""

    def __init__(self, writer: ShmWriter | None, chunk_frames: int, chunks: int) -> None:
        self.writer = writer
        self.chunk_frames = chunk_frames
        self.chunks = chunks
        self.first = np.zeros(FRAME, "<f4").tobytes()
        self.steady = np.zeros(chunk_frames * FRAME, "<f4").tobytes()
        self.active: dict[int, _Request] = {}
        self.tick = 0
        self.ticker: asyncio.Task[None] | None = None

    async def Status(self, request: Any, context: Any) -> S.CodecStatusResponse:  # noqa: N802
        w = self.writer
        hello = local_hello(
            probe_region=w.probe_region if w else "", shm_threshold_bytes=w.threshold_bytes if w else 0
        )
        return S.CodecStatusResponse(
            status=S.StageStatus(ready=True, link=True, transport=hello_to_proto(hello))
        )

    async def _tick(self) -> None:
        t0 = time.perf_counter()
        while True:
            self.tick += 1
            await asyncio.sleep(max(0.0, t0 + self.tick * TICK_S - time.perf_counter()))
            for req in self.active.values():  # one callback: the tick's audio, as the engine hands it out
                if req.due <= self.tick:
                    self._emit(req)

    def _emit(self, req: _Request) -> None:
        data = self.steady if req.started else self.first
        samples = len(data) // 4
        if req.credit < samples or req.steady_left == 0:
            return
        placed = req.sender.place(data) if req.sender is not None else data
        chunk = S.PcmChunk(
            sample_offset=req.sent,
            sample_count=samples,
            format=S.PCM_FORMAT_F32LE,
            sent_unix_ns=time.time_ns(),
        )
        chunk.data.CopyFrom(to_payload(placed))
        req.out.put_nowait(S.CodecStreamResponse(pcm=chunk))
        req.credit -= samples
        req.sent += samples
        req.due = self.tick + self.chunk_frames
        if req.started:
            req.steady_left -= 1
        req.started = True
        if req.steady_left == 0:
            frames = req.sent // FRAME
            req.out.put_nowait(S.CodecStreamResponse(segment_done=S.SegmentDone(frame_count=frames)))
            eos = S.EndOfStream(reason=S.END_REASON_EOS, frame_count=frames, sample_count=req.sent)
            req.out.put_nowait(S.CodecStreamResponse(end_of_stream=eos))

    async def Stream(  # noqa: N802
        self, requests: AsyncIterator[S.CodecStreamRequest], context: Any
    ) -> AsyncIterator[S.CodecStreamResponse]:
        if self.ticker is None:
            self.ticker = asyncio.ensure_future(self._tick())
        it = aiter(requests)
        op = (await anext(it)).open
        sender = None
        if self.writer is not None and not isinstance(context, LinkContext):  # on a link: the slab instead
            sender = self.writer.sender(
                peer_readable=self.writer.peer_can_read(op.transport.verified_peer_probe)
            )
        req = _Request(op.initial_credit.amount, sender, self.tick + 1, self.chunks)
        yield S.CodecStreamResponse(opened=S.StreamOpened(request_id=op.request_id))

        async def read() -> None:
            async for msg in it:
                kind = msg.WhichOneof("request")
                if kind == "credit":
                    req.credit += msg.credit.amount
                elif kind == "shm_ack" and req.sender is not None:
                    req.sender.ack(acked_refs(msg.shm_ack))

        reader = asyncio.ensure_future(read())
        key = id(req)
        self.active[key] = req
        try:
            while True:
                msg = await req.out.get()
                yield msg
                if msg.HasField("end_of_stream"):
                    break
            # As the stages do (voxstage.stage.servicer): the call stays open until the client half-closes,
            # since ending it under the client's last credit fails that write and the call with INTERNAL.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(reader), 1.0)
        finally:
            self.active.pop(key, None)
            reader.cancel()
            if sender is not None:
                sender.close()

    async def Link(self, batches: Any, context: Any) -> AsyncIterator[Any]:  # noqa: N802
        session = LinkSession(self.Stream, CODEC_REQUESTS, CODEC_RESPONSES, writer=self.writer, reader=None)
        out = session.run(batches)
        try:
            async for batch in out:
                yield batch
        except asyncio.CancelledError:
            pass
        finally:
            await out.aclose()


class _CountingReader(ShmReader):
    """The client's shared-memory reads: a chunk each on a call per request, a tick's slab each on a link."""

    def __init__(self) -> None:
        super().__init__()
        self.reads = 0
        self.read_bytes = 0

    def read(self, ref: Any) -> bytes:
        self.reads += 1
        self.read_bytes += ref.length
        return super().read(ref)


@dataclass
class _Tally:
    measuring: bool = False
    chunks: int = 0
    bytes: int = 0
    messages: int = 0  # gRPC messages of the stream mode, both ways
    requests: int = 0
    errors: int = 0
    delivery_ms: list[float] = field(default_factory=list)


async def _one_request(
    stub: Any, link: LinkClient | None, hello: Any, verified: str, reader: ShmReader | None, n: int, t: _Tally
) -> None:
    call = stub.Stream() if link is None else link.stream(None, hello)
    op = S.StreamOpen(request_id=f"r{n}", mode=S.STREAM_MODE_TTS, initial_credit=S.Credit(
        unit=S.CREDIT_UNIT_SAMPLES, amount=WINDOW_FRAMES * FRAME))  # fmt: skip
    if link is None and verified:
        op.transport.verified_peer_probe = verified
    counts = link is None  # gRPC messages are counted for the stream mode (on a link: batches)

    async def write(msg: S.CodecStreamRequest) -> None:
        await call.write(msg)
        t.messages += counts and t.measuring

    for msg in (S.CodecStreamRequest(open=op), S.CodecStreamRequest(text="one request's text, as it comes."),
                S.CodecStreamRequest(end_of_input=S.EndOfInput())):  # fmt: skip
        await write(msg)
    try:
        async for msg in call:
            t.messages += counts and t.measuring
            if msg.HasField("pcm"):
                pcm = msg.pcm
                data, ref = read_payload(pcm.data, reader if verified and link is None else None)
                if t.measuring:
                    t.chunks += 1
                    t.bytes += len(data)
                    t.delivery_ms.append((time.time_ns() - pcm.sent_unix_ns) / 1e6)
                if ref is not None:
                    await write(S.CodecStreamRequest(shm_ack=ack_message([ref])))
                credit = S.Credit(unit=S.CREDIT_UNIT_SAMPLES, amount=pcm.sample_count)
                await write(S.CodecStreamRequest(credit=credit))
            elif msg.HasField("end_of_stream"):
                await call.done_writing()
                if t.measuring:
                    t.requests += 1
                break
    finally:
        if not call.done():
            call.cancel()


async def tts_level(
    address: str,
    streams: int,
    seconds: float,
    mode: str,
    server_pid: int,
    *,
    chunks: int,
    shm: bool,
    cpu_s: Any,
) -> dict[str, Any]:
    channel = grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS)
    stub = stage_pb2_grpc.CodecStub(channel)
    status = (await stub.Status(S.CodecStatusRequest())).status
    hello = hello_from_proto(status.transport)
    reader = _CountingReader() if shm else None
    verified = verify_peer(hello) if reader is not None else ""
    link = (
        LinkClient("codec", stub.Link, CODEC_REQUESTS, CODEC_RESPONSES, reader=reader)
        if mode == "link"
        else None
    )
    tally = _Tally()
    stop = asyncio.Event()

    async def slot(i: int) -> None:
        await asyncio.sleep((i % 25) * TICK_S)  # staggered: chunks spread over the ticks
        n = 0
        while not stop.is_set():
            try:
                await _one_request(stub, link, hello, verified, reader, i * 1_000_000 + n, tally)
            except grpc.aio.AioRpcError:
                tally.errors += tally.measuring
            n += 1

    tasks = [asyncio.ensure_future(slot(i)) for i in range(streams)]
    await asyncio.sleep((min(streams, 25) + 2) * TICK_S)  # every slot started and had its first chunk
    tally.measuring = True
    batches0 = link._conn.port.batches if link is not None and link._conn is not None else 0
    reads0 = (reader.reads, reader.read_bytes) if reader is not None else (0, 0)
    t_cpu, s_cpu, t0 = time.process_time(), cpu_s(server_pid), time.perf_counter()
    await asyncio.sleep(seconds)
    wall = time.perf_counter() - t0
    client_cpu, server_cpu = time.process_time() - t_cpu, cpu_s(server_pid) - s_cpu
    tally.measuring = False
    batches = link._conn.port.batches - batches0 if link is not None and link._conn is not None else None
    reads = (reader.reads - reads0[0], reader.read_bytes - reads0[1]) if reader is not None else (0, 0)
    stop.set()
    for task in tasks:
        task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await asyncio.gather(*tasks, return_exceptions=True)
    if link is not None:
        link.close()
    await channel.close()
    delivery = np.array(tally.delivery_ms or [0.0])
    return {
        "shape": "tts",
        "mode": mode,
        "streams": streams,
        "shm": shm,
        "wall_s": wall,
        "chunks": tally.chunks,
        "chunks_per_s": tally.chunks / wall,
        "mb_per_s": tally.bytes / wall / 1e6,
        "requests_finished": tally.requests,
        "request_errors": tally.errors,
        "client_cpu_ms_per_s": 1000 * client_cpu / wall,
        "server_cpu_ms_per_s": 1000 * server_cpu / wall,
        "client_cpu_us_per_chunk": 1e6 * client_cpu / max(tally.chunks, 1),
        "server_cpu_us_per_chunk": 1e6 * server_cpu / max(tally.chunks, 1),
        "grpc_messages_per_s": None if mode == "link" else tally.messages / wall,
        "client_link_batches_per_s": None if batches is None else batches / wall,
        "shm_reads_per_s": reads[0] / wall,  # a chunk each (stream) or a slab each (link)
        "shm_mb_per_s": reads[1] / wall / 1e6,
        "delivery_ms_p50": float(np.percentile(delivery, 50)),
        "delivery_ms_p99": float(np.percentile(delivery, 99)),
    }
