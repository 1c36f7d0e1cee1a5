"""Issue 15: ``voxstage codec --allowed-talkers`` dials only the listed talkers. An ``open`` naming another
``talker_address`` ends in-band with PERMISSION_DENIED (docs/protocol.md §7) and nothing is dialled, on the
duplex path (in process: tiny Mimi against the kit's fake talker) and the TTS path (a real codec process
with the tiny preset, and a local listener standing in for the talker it must not reach)."""

from __future__ import annotations

import asyncio
import functools
import socket
import time
from pathlib import Path

import codec_duplex_kit
import grpc
import pytest
from codec_duplex_kit import FakeTalker, Session, only_message, stage

from services.codec.duplex.engine import DuplexCodecEngine
from services.codec.models.mimi.loader import random_init
from services.codec.models.mimi.model import MimiModel
from services.codec.models.mimi.presets import tiny_config
from services.codec.upstream import TalkerPool, parse_allowed_talkers
from tests.integration.stagekit import start_stage
from voxstage.internal.v1 import stage_pb2 as S
from voxstage.internal.v1 import stage_pb2_grpc
from voxstage.stage.errors import CODES, StageFailure

REPO = Path(__file__).resolve().parents[3]
PERMISSION_DENIED = 7
UNAVAILABLE = 14


def test_the_flag_parses_host_port_lists() -> None:
    assert parse_allowed_talkers(None) is None and parse_allowed_talkers("") is None
    parsed = parse_allowed_talkers(" talker:50061, 10.0.0.5:1 ,[::1]:7")
    assert parsed == {"talker:50061", "10.0.0.5:1", "[::1]:7"}
    for bad in ("talker", "talker:", ":50061", "talker:port", "talker:70000"):
        with pytest.raises(ValueError, match="--allowed-talkers"):
            parse_allowed_talkers(bad)
    assert CODES["PERMISSION_DENIED"] == PERMISSION_DENIED


async def test_the_pool_refuses_before_it_makes_a_channel() -> None:
    pool = TalkerPool(None, allowed=["Talker:50061"])
    with pytest.raises(StageFailure) as err:
        pool.peer("evil.example:80")
    assert err.value.code == "PERMISSION_DENIED" and "talker_address" in err.value.message
    assert "evil.example:80" in err.value.message and not pool._peers
    assert pool.peer("talker:50061").address == "talker:50061"  # allowed (host compared case-insensitively)
    open_pool = TalkerPool(None)  # no list: any talker (local use, backwards compatible)
    assert open_pool.peer("anywhere:1").address == "anywhere:1"
    await pool.close()
    await open_pool.close()


# -- duplex (in process) -------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def model() -> MimiModel:
    return random_init(tiny_config(), seed=8)


def _allow(monkeypatch: pytest.MonkeyPatch, *addresses: str) -> None:
    monkeypatch.setattr(codec_duplex_kit, "TalkerPool", functools.partial(TalkerPool, allowed=addresses))


async def test_duplex_open_naming_another_talker_is_denied_and_not_dialled(
    model: MimiModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    _allow(monkeypatch, "127.0.0.1:1")
    joins: list[str] = []
    join = DuplexCodecEngine.join
    monkeypatch.setattr(DuplexCodecEngine, "join", lambda engine, key: joins.append(key) or join(engine, key))
    talker = FakeTalker()
    async with stage(model, talker) as rig:
        eos = await only_message(rig, rig.open_msg())
        assert eos.reason == S.END_REASON_ERROR and eos.error.code == PERMISSION_DENIED
        assert "talker_address" in eos.error.message and rig.talker_address in eos.error.message
        assert talker.opens == [] and [k for k in joins if k != "__warmup__"] == []  # no slot, no dial
        status = await rig.status()
        assert status.ready and not status.requests  # nothing left open behind the refusal


async def test_duplex_open_naming_an_allowed_talker_proceeds(
    model: MimiModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    talker = FakeTalker()
    pools: list[TalkerPool] = []

    def pool(reader: object) -> TalkerPool:
        pools.append(TalkerPool(reader, allowed=["127.0.0.1:1"]))  # type: ignore[arg-type]
        return pools[-1]

    monkeypatch.setattr(codec_duplex_kit, "TalkerPool", pool)
    async with stage(model, talker) as rig:
        (made,) = pools
        made.allowed = frozenset({rig.talker_address, "127.0.0.1:1"})  # the fake talker's port, now known
        s = Session(rig)
        s.send(open=rig.open_msg())
        msg = await s.recv()
        assert msg is not None and msg.HasField("opened"), msg
        s.send(end_of_input=S.EndOfInput())
        await s.until(lambda m: m.HasField("end_of_stream"))
        await s.finish()
        assert len(talker.opens) == 1


# -- TTS (a real codec process) ------------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _tts_open(talker: str) -> S.CodecStreamRequest:
    op = S.StreamOpen(
        request_id=f"sec-{time.monotonic_ns()}",
        mode=S.STREAM_MODE_TTS,
        talker_address=talker,
        voice="ryan",
        pcm_format=S.PCM_FORMAT_F32LE,
        initial_credit=S.Credit(unit=S.CREDIT_UNIT_SAMPLES, amount=51 * 1920),
    )
    return S.CodecStreamRequest(open=op)


async def _terminal(codec: str, talker: str) -> S.EndOfStream:
    async with grpc.aio.insecure_channel(codec) as channel:
        outbox: asyncio.Queue[S.CodecStreamRequest | None] = asyncio.Queue()
        outbox.put_nowait(_tts_open(talker))

        async def requests():  # type: ignore[no-untyped-def]
            while (msg := await outbox.get()) is not None:
                yield msg

        call = stage_pb2_grpc.CodecStub(channel).Stream(requests(), timeout=30)
        try:
            async for resp in call:
                if resp.HasField("end_of_stream"):
                    return resp.end_of_stream
        finally:
            outbox.put_nowait(None)
    raise AssertionError("no terminal")


def test_tts_open_is_denied_unless_its_talker_is_allowed(tmp_path: Path) -> None:
    decoy = socket.socket()  # stands in for an address the caller wants the codec to reach
    decoy.bind(("127.0.0.1", 0))
    decoy.listen(8)
    decoy.setblocking(False)
    denied = f"127.0.0.1:{decoy.getsockname()[1]}"
    allowed = f"127.0.0.1:{_free_port()}"  # nothing listens there: a dial fails as UNAVAILABLE
    port = _free_port()
    codec = start_stage(
        "codec", port=port, cache=tmp_path / "cache", logs=tmp_path,
        extra=["--allowed-talkers", f"{allowed},talker.invalid:50061"],
    )  # fmt: skip
    try:
        codec.wait_serving(120)
        eos = asyncio.run(_terminal(f"127.0.0.1:{port}", denied))
        assert eos.reason == S.END_REASON_ERROR and eos.error.code == PERMISSION_DENIED, eos
        assert "talker_address" in eos.error.message and denied in eos.error.message
        with pytest.raises(BlockingIOError):
            decoy.accept()  # the codec never connected to it
        eos = asyncio.run(_terminal(f"127.0.0.1:{port}", allowed))
        assert eos.error.code == UNAVAILABLE and "unreachable" in eos.error.message, eos  # it dialled
    finally:
        decoy.close()
        codec.stop()
