"""Shared rigs of the duplex codec tests: an injected-clock engine rig with counted batched calls and solo
references, and an in-process codec stage (servicer, worker, engine thread) with a fake talker that follows
docs/protocol.md §11 (a test double: the real talker is tested on its own).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import grpc
import numpy as np
import torch

from services.codec.duplex.calls import PackedCalls
from services.codec.duplex.engine import DuplexCodecEngine
from services.codec.duplex.types import AgentAudio, AgentFrame, DuplexCodecConfig, UserCodes
from services.codec.duplex.worker import DuplexCodecWorker
from services.codec.models import DuplexCodecRuntime
from services.codec.models.mimi.model import MimiModel
from services.codec.models.mimi.recording import prepare_reference
from services.codec.models.mimi.streaming import MimiStreamingCodec
from services.codec.servicer import CodecServicer
from services.codec.upstream import TalkerPool
from voxstage.config import ChunkPlan, ConnectorExtra
from voxstage.internal.v1 import stage_pb2 as S
from voxstage.internal.v1 import stage_pb2_grpc
from voxstage.link.server import LinkSession
from voxstage.link.wire import TALKER_REQUESTS, TALKER_RESPONSES

SPF = 1920
K = 8
MODEL = "personaplex-tiny"
CODE = {
    name: grpc.StatusCode[name].value[0]
    for name in ("INVALID_ARGUMENT", "NOT_FOUND", "UNAVAILABLE", "FAILED_PRECONDITION", "RESOURCE_EXHAUSTED")
}


def speech(seed: int, frames: int) -> np.ndarray:
    """Band-limited noise with a slow envelope, well inside [-1, 1]."""
    x = np.random.default_rng(seed).standard_normal(frames * SPF + 31).astype(np.float32)
    x = np.convolve(x, np.ones(32, np.float32) / 32, mode="valid")[: frames * SPF]
    return 0.5 * x * (0.5 + 0.4 * np.sin(np.arange(x.size) / 3000.0, dtype=np.float32))


# -- the engine alone, on an injected clock ---------------------------------------------------------------
class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class CountingCalls(PackedCalls):
    """The engine's batched calls, counted (batch sizes and lengths recorded)."""

    def __init__(self, codec: object) -> None:
        super().__init__(codec)
        self.encodes: list[list[int]] = []
        self.decodes: list[list[int]] = []

    def encode(self, pcm: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        self.encodes.append(lengths.tolist())
        return super().encode(pcm, lengths)

    def decode(self, codes: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        self.decodes.append(lengths.tolist())
        return super().decode(codes, lengths)


@dataclass
class EngineRig:
    engine: DuplexCodecEngine
    calls: CountingCalls
    clock: Clock
    user: dict[str, list[UserCodes]] = field(default_factory=dict)
    agent: dict[str, list[AgentAudio]] = field(default_factory=dict)

    def run(self, until: float) -> None:
        """Step the engine while it has work, moving the clock to each deadline, up to ``until``."""
        while True:
            if self.engine.has_work():
                for out in self.engine.step():
                    into = self.user if isinstance(out, UserCodes) else self.agent
                    into.setdefault(out.session_id, []).append(out)
                continue
            wait = self.engine.idle_timeout()
            if wait is None or self.clock.now + wait > until:
                self.clock.now = max(self.clock.now, until)
                return
            self.clock.now += wait

    def tick(self) -> None:
        """Advance to the next tick and run it."""
        assert self.engine._next_tick is not None
        self.run(self.engine._next_tick)


def make_rig(model: MimiModel, sessions: int = 4, **cfg: object) -> EngineRig:
    codec = MimiStreamingCodec(model, sessions + 1)
    clock = Clock()
    calls = CountingCalls(codec)
    config = DuplexCodecConfig(max_sessions=sessions, **cfg)  # type: ignore[arg-type]
    return EngineRig(DuplexCodecEngine(codec, config, calls=calls, clock=clock), calls, clock)


def agent_codes(seed: int, frames: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 2048, size=(frames, K), dtype=np.int64)


def solo_encode(model: MimiModel, pcm: np.ndarray) -> np.ndarray:
    """User codes ``[frames, K]`` of ``pcm`` streamed frame by frame through a fresh one-slot pool."""
    codec = MimiStreamingCodec(model, 1)
    frames = torch.from_numpy(pcm).reshape(-1, 1, SPF)
    return np.stack([codec.encode(f, torch.tensor([0]))[0, :, 0].numpy() for f in frames])


def solo_decode(model: MimiModel, codes: np.ndarray) -> np.ndarray:
    codec = MimiStreamingCodec(model, 1)
    out = [codec.decode(torch.from_numpy(c.reshape(1, K, 1)), torch.tensor([0]))[0].numpy() for c in codes]
    return np.concatenate(out)


def answer(rig: EngineRig, sid: str, codes: np.ndarray, n: int) -> None:
    """The fake talker: agent frame n for the user frame n-1 (frame 0 is the prompt's own step)."""
    rig.engine.push_agent(sid, AgentFrame(n, codes[n], 100 + n, f"t{n} ", n - 1))


# -- the codec stage in process, against a fake talker -----------------------------------------------------
class FakeTalker(stage_pb2_grpc.TalkerServicer):
    """A duplex talker by the book, minus the model: agent frame n answers user frame n - 1."""

    def __init__(self, mode: str = "ok", user_credit: int = 4, *, link: bool = False) -> None:
        self.mode = mode  # ok | refuse | die
        self.user_credit = user_credit
        self.link = link  # offers Talker.Link (served by the stages' own link code, voxstage.link.server)
        self.links = 0  # Link calls served
        self.opens: list[S.StreamOpen] = []
        self.user_codes: list[S.CodecFrames] = []
        self.got: list[str] = []  # message kinds after open

    async def Status(  # noqa: N802 - gRPC method name
        self, request: S.TalkerStatusRequest, context: grpc.aio.ServicerContext
    ) -> S.TalkerStatusResponse:
        status = S.StageStatus(ready=True, model=MODEL, family="personaplex", link=self.link)
        return S.TalkerStatusResponse(status=status)

    async def Link(  # noqa: N802 - gRPC method name
        self, batches: AsyncIterator[Any], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[Any]:
        self.links += 1
        session = LinkSession(self.Stream, TALKER_REQUESTS, TALKER_RESPONSES, writer=None, reader=None)
        out = session.run(batches)
        try:
            async for batch in out:
                yield batch
        except asyncio.CancelledError:
            pass
        finally:
            await out.aclose()

    async def Stream(  # noqa: N802 - gRPC method name
        self, requests: AsyncIterator[S.TalkerStreamRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[S.TalkerStreamResponse]:
        messages = aiter(requests)
        op = (await anext(messages)).open
        self.opens.append(op)
        if self.mode == "refuse":
            error = S.StreamError(code=8, message="all 1 talker slots hold live sessions", origin="talker")
            yield S.TalkerStreamResponse(end_of_stream=S.EndOfStream(reason=S.END_REASON_ERROR, error=error))
            return
        credit = S.Credit(unit=S.CREDIT_UNIT_FRAMES, amount=self.user_credit)
        yield S.TalkerStreamResponse(
            opened=S.StreamOpened(model=MODEL, family="personaplex", num_code_groups=8, initial_credit=credit)
        )
        sent = 0
        yield self._frame(sent, -1)  # the prompt's last frame
        sent += 1
        async for msg in messages:
            kind = msg.WhichOneof("request")
            self.got.append(kind)
            if kind == "user_codes":
                self.user_codes.append(msg.user_codes)
                if self.mode == "die" and len(self.user_codes) == 3:
                    await context.abort(grpc.StatusCode.UNAVAILABLE, "talker killed")
                yield self._frame(sent, int(msg.user_codes.first_frame))
                sent += 1
                yield S.TalkerStreamResponse(credit=S.Credit(unit=S.CREDIT_UNIT_FRAMES, amount=1))
            elif kind in ("end_of_input", "cancel"):
                reason = S.END_REASON_EOS if kind == "end_of_input" else S.END_REASON_CANCELLED
                yield S.TalkerStreamResponse(end_of_stream=S.EndOfStream(reason=reason, frame_count=sent))
                return

    @staticmethod
    def _frame(index: int, user_frame: int) -> S.TalkerStreamResponse:
        codes = np.random.default_rng(index).integers(0, 2048, (1, 8)).astype("<i2")
        frames = S.CodecFrames(
            first_frame=index,
            frame_count=1,
            num_groups=8,
            codes=S.Payload(inline=codes.tobytes()),
            text_tokens=np.array([1000 + index], "<i4").tobytes(),
            transcript_delta=f"w{index} ",
            user_frame=user_frame,
        )
        return S.TalkerStreamResponse(frames=frames)


@dataclass
class Rig:
    talker: FakeTalker
    talker_address: str
    channel: grpc.aio.Channel
    model: MimiModel
    server: grpc.aio.Server | None = None  # the codec's
    address: str = ""  # the codec's
    engine: DuplexCodecEngine | None = None  # the codec's (its count of user frames skipped ticks dropped)

    @property
    def unheard(self) -> int:
        """User frames the codec dropped because its engine ran a tick late (by design: a loaded machine's
        skipped ticks go unheard); the tests' exact counts allow for them and for nothing else."""
        assert self.engine is not None
        return self.engine.unheard_frames

    def open_msg(self, **fields: object) -> S.StreamOpen:
        base: dict[str, object] = {
            "request_id": "r1",
            "mode": S.STREAM_MODE_DUPLEX,
            "talker_address": self.talker_address,
            "model": MODEL,
            "voice": "NATF0",
            "instructions": "Be kind.",
            "seed": 3,
            "initial_credit": S.Credit(unit=S.CREDIT_UNIT_SAMPLES, amount=2 * 24000),
        }
        return S.StreamOpen(**(base | fields))  # type: ignore[arg-type]

    async def talker_cancelled(self, timeout_s: float = 5.0) -> bool:
        """Whether the fake talker's last message is (or becomes, within ``timeout_s``) a cancel: it travels
        the link after the codec has already ended the session towards the gateway."""
        deadline = asyncio.get_running_loop().time() + timeout_s
        while not (self.talker.got and self.talker.got[-1] == "cancel"):
            if asyncio.get_running_loop().time() > deadline:
                return False
            await asyncio.sleep(0.01)
        return True

    async def status(self) -> S.StageStatus:
        stub = stage_pb2_grpc.CodecStub(self.channel)
        return (await stub.Status(S.CodecStatusRequest(include_requests=True))).status


@contextlib.asynccontextmanager
async def stage(
    model: MimiModel, talker: FakeTalker, *, jitter: int = 24000, sessions: int = 2
) -> AsyncIterator[Rig]:
    tserver = grpc.aio.server()
    stage_pb2_grpc.add_TalkerServicer_to_server(talker, tserver)
    tport = tserver.add_insecure_port("127.0.0.1:0")
    await tserver.start()
    codec = MimiStreamingCodec(model, sessions + 1)
    runtime = DuplexCodecRuntime(
        "personaplex", MODEL, codec, 8, 2048, 24000, SPF, codec.state_bytes_per_stream(), prepare_reference
    )
    engine = DuplexCodecEngine(
        codec, DuplexCodecConfig(max_sessions=sessions, jitter_samples=jitter, tick_s=0.02)
    )
    worker = DuplexCodecWorker(runtime, engine)
    worker.start(asyncio.get_running_loop())
    await worker.warm_up()
    pool = TalkerPool(None)
    extra = ConnectorExtra()
    servicer = CodecServicer(
        worker,
        plan=ChunkPlan.from_extra(extra, whole_take=False),
        stream_config=extra,
        shm_writer=None,
        pool=pool,
    )
    servicer.ready = True
    cserver = grpc.aio.server()
    stage_pb2_grpc.add_CodecServicer_to_server(servicer, cserver)
    cport = cserver.add_insecure_port("127.0.0.1:0")
    await cserver.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{cport}")
    try:
        yield Rig(talker, f"127.0.0.1:{tport}", channel, model, cserver, f"127.0.0.1:{cport}", engine)
    finally:
        await channel.close()
        await cserver.stop(0)
        await tserver.stop(0)
        await pool.close()
        worker.stop()


@dataclass
class Session:
    """The gateway's side of one duplex ``Codec.Stream``."""

    rig: Rig
    outbox: asyncio.Queue[S.CodecStreamRequest | None] = field(default_factory=asyncio.Queue)
    got: list[S.CodecStreamResponse] = field(default_factory=list)
    user_sent: int = 0

    def __post_init__(self) -> None:
        self.call = stage_pb2_grpc.CodecStub(self.rig.channel).Stream(self._requests(), timeout=30)

    async def _requests(self) -> AsyncIterator[S.CodecStreamRequest]:
        while (msg := await self.outbox.get()) is not None:
            yield msg

    def send(self, **kind: object) -> None:
        self.outbox.put_nowait(S.CodecStreamRequest(**kind))  # type: ignore[arg-type]

    def send_audio(self, pcm: np.ndarray) -> None:
        chunk = S.PcmChunk(sample_offset=self.user_sent, sample_count=pcm.size, format=S.PCM_FORMAT_F32LE)
        chunk.data.inline = pcm.astype("<f4").tobytes()
        self.send(user_audio=chunk)
        self.user_sent += pcm.size

    async def recv(self) -> S.CodecStreamResponse | None:
        msg = await asyncio.wait_for(self.call.read(), 10)
        if msg is grpc.aio.EOF:
            return None
        self.got.append(msg)
        return msg

    async def until(self, done: object) -> S.CodecStreamResponse:
        """Read (granting back every PCM chunk) until ``done(msg)``."""
        while (msg := await self.recv()) is not None:
            if msg.HasField("pcm"):
                self.send(credit=S.Credit(unit=S.CREDIT_UNIT_SAMPLES, amount=msg.pcm.sample_count))
            if done(msg):  # type: ignore[operator]
                return msg
        raise AssertionError("the stream ended early")

    async def finish(self) -> None:
        self.outbox.put_nowait(None)
        with contextlib.suppress(grpc.aio.AioRpcError):
            await self.call.code()

    def pcm(self) -> list[S.PcmChunk]:
        return [m.pcm for m in self.got if m.HasField("pcm")]


async def only_message(rig: Rig, op: S.StreamOpen) -> S.EndOfStream:
    s = Session(rig)
    s.send(open=op)
    msg = await s.recv()
    await s.finish()
    assert msg is not None and msg.HasField("end_of_stream"), msg
    return msg.end_of_stream
