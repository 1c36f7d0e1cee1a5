"""A real ``voxstage talker`` process serving PersonaPlex duplex sessions (tiny preset, CPU), driven through
``Talker.Stream`` exactly as the codec drives it (docs/protocol.md §11)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator

import grpc
import numpy as np
import pytest

from tests.integration.deploykit import free_port
from tests.integration.stagekit import ROOT, StageProc, start_stage
from voxstage.internal.v1 import stage_pb2 as S
from voxstage.internal.v1 import stage_pb2_grpc

DEPLOY = ROOT / "deploy" / "personaplex.yaml"
MODEL = "personaplex-tiny"


@pytest.fixture(scope="module")
def talker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StageProc]:
    cache = tmp_path_factory.mktemp("cache")
    from voxstage.presets import resolve_model

    resolve_model(MODEL, cache=cache)
    proc = start_stage(
        "talker",
        port=free_port(),
        cache=cache,
        logs=tmp_path_factory.mktemp("logs"),
        model=MODEL,
        deploy=DEPLOY,
        sets=["stages.0.max_num_seqs=2"],
    )
    try:
        proc.wait_serving(120)
        yield proc
    finally:
        proc.stop()


class Session:
    def __init__(self, address: str, voice: str = "NATF0", persona: str = "You are nice.") -> None:
        self.channel = grpc.aio.insecure_channel(address)
        self.outbox: asyncio.Queue[S.TalkerStreamRequest | None] = asyncio.Queue()
        op = S.StreamOpen(
            request_id=f"dt-{time.monotonic_ns()}",
            mode=S.STREAM_MODE_DUPLEX,
            voice=voice,
            instructions=persona,
            seed=7,
            initial_credit=S.Credit(unit=S.CREDIT_UNIT_FRAMES, amount=25),
        )
        self.outbox.put_nowait(S.TalkerStreamRequest(open=op))
        self.call = stage_pb2_grpc.TalkerStub(self.channel).Stream(self._requests(), timeout=60)
        self.sent = 0

    async def _requests(self) -> AsyncIterator[S.TalkerStreamRequest]:
        while (msg := await self.outbox.get()) is not None:
            yield msg

    def send_frame(self, codes: np.ndarray) -> None:
        frames = S.CodecFrames(first_frame=self.sent, frame_count=1, num_groups=8)
        frames.codes.inline = np.asarray(codes, "<i2").tobytes()
        self.outbox.put_nowait(S.TalkerStreamRequest(user_codes=frames))
        self.sent += 1

    async def close(self) -> None:
        self.outbox.put_nowait(S.TalkerStreamRequest(end_of_input=S.EndOfInput()))

    async def finish(self) -> None:
        self.outbox.put_nowait(None)
        await self.channel.close()


async def converse(address: str, ticks: int, rng: np.random.Generator) -> dict[str, list]:
    s = Session(address)
    got: dict[str, list] = {"frames": [], "credits": [], "eos": [], "opened": []}

    async def reader() -> None:
        async for msg in s.call:
            kind = msg.WhichOneof("response")
            if kind == "end_of_stream":
                got["eos"].append(msg.end_of_stream)
                return
            got[{"frames": "frames", "credit": "credits", "opened": "opened"}[kind]].append(
                getattr(msg, kind)
            )

    task = asyncio.create_task(reader())
    for _ in range(ticks):
        await asyncio.sleep(0.08)
        s.send_frame(rng.integers(0, 2048, 8))
    await asyncio.sleep(0.3)
    await s.close()
    await asyncio.wait_for(task, 30)
    await s.finish()
    return got


def test_two_sessions_at_once_get_one_agent_frame_per_user_frame(talker: StageProc) -> None:
    async def main() -> list[dict[str, list]]:
        rng = np.random.default_rng(0)
        return await asyncio.gather(converse(talker.address, 20, rng), converse(talker.address, 12, rng))

    for got, ticks in zip(asyncio.run(main()), (20, 12), strict=True):
        assert got["opened"][0].family == "personaplex" and got["opened"][0].initial_credit.amount == 25
        frames = got["frames"]
        # The prompt's last frame, then one per user frame (a trailing one may still be in flight at close).
        assert ticks <= len(frames) <= ticks + 1
        assert [f.first_frame for f in frames] == list(range(len(frames)))
        assert frames[0].user_frame == -1 and [f.user_frame for f in frames[1:]] == list(
            range(len(frames) - 1)
        )
        for f in frames:
            codes = np.frombuffer(f.codes.inline, "<i2")
            assert codes.shape == (8,) and (0 <= codes).all() and (codes < 2048).all()
            assert len(f.text_tokens) == 4
        assert sum(c.amount for c in got["credits"]) == len(frames) - 1
        (eos,) = got["eos"]
        assert eos.reason == S.END_REASON_EOS and eos.frame_count == len(frames)


def test_a_third_session_is_refused_and_bad_input_fails_only_its_session(talker: StageProc) -> None:
    async def main() -> tuple[list, list, list]:
        rng = np.random.default_rng(1)
        live = [asyncio.create_task(converse(talker.address, 15, rng)) for _ in range(2)]
        await asyncio.sleep(0.5)
        third = Session(talker.address)
        refused = [m async for m in third.call]
        await third.finish()
        for t in live:
            await t
        bad = Session(talker.address)
        await asyncio.sleep(0.2)
        bad.send_frame(np.full(8, 4096))  # outside the codebook
        answers = [m async for m in bad.call]
        await bad.finish()
        return refused, [t.result() for t in live], answers

    refused, live, answers = asyncio.run(main())
    (eos,) = [m.end_of_stream for m in refused]
    assert eos.reason == S.END_REASON_ERROR and eos.error.code == grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]
    for got in live:
        assert got["eos"][0].reason == S.END_REASON_EOS and len(got["frames"]) >= 15
    terminal = answers[-1].end_of_stream
    assert terminal.error.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert "user_codes.codes" in terminal.error.message
