"""Stage links (docs/protocol.md §12) in process: the gateway's own duplex client
(``gateway.duplex.upstream``) over ``Codec.Link`` to the real codec stage (servicer, worker, engine thread,
tiny Mimi), which carries its sessions over ``Talker.Link`` to an in-test fake talker served by the stages'
own link code (``voxstage.link.server``; the real talker is tested over links in tests/integration). Several
sessions share each link; each test makes one of them misbehave and checks that the others do not notice.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import grpc
import pytest
from codec_duplex_kit import SPF, FakeTalker, Rig, speech, stage

from gateway.duplex.upstream import AgentPcm, DuplexCodecStream
from gateway.errors import GatewayError
from gateway.routing import ReplicaPool, codec_status
from gateway.upstream import Timeouts
from services.codec.models.mimi.loader import random_init
from services.codec.models.mimi.model import MimiModel
from services.codec.models.mimi.presets import tiny_config
from voxstage.internal.v1 import stage_pb2 as S
from voxstage.internal.v1 import stage_pb2_grpc

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def model() -> MimiModel:
    return random_init(tiny_config(), seed=8)


async def codecs(*addresses: str) -> ReplicaPool:
    pool = ReplicaPool("codec", list(addresses), codec_status, static_only=True)
    await pool.probe_all(force=True)
    assert all(r.status is not None and r.status.link for r in pool.replicas)
    return pool


@dataclass
class Caller:
    """One session as the gateway drives it: real-time-ish user audio within the codec's grant, agent audio
    granted back as it is taken (unless ``grant`` is off)."""

    pool: ReplicaPool
    rig: Rig
    name: str
    replica_index: int = 0
    window: int = 2 * 24000
    talker_address: str = ""
    frames: list[AgentPcm] = field(default_factory=list)
    terminal: S.EndOfStream | None = None
    error: GatewayError | None = None
    got_frames: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        replica = self.pool.replicas[self.replica_index]
        self.s = DuplexCodecStream(self.pool, replica, timeouts=Timeouts(10, 3), tick_s=0.02)

    async def run(self, user_frames: int, *, grant: bool = True, cancel_at: int | None = None) -> None:
        credit = S.Credit(unit=S.CREDIT_UNIT_SAMPLES, amount=self.window)
        op = self.rig.open_msg(request_id=self.name, initial_credit=credit)
        if self.talker_address:
            op.talker_address = self.talker_address
        audio = speech(len(self.name), user_frames)
        sent, ended = 0, False
        try:
            await self.s.open_duplex(op)
            while True:
                while sent < user_frames and self.s.user_credit >= SPF:
                    await self.s.send_user_frame(audio[sent * SPF : (sent + 1) * SPF])
                    sent += 1
                if sent == user_frames and not ended:
                    ended = True
                    await self.s.end_of_input(owes_segment=False)
                event = await self.s.next_event()
                if isinstance(event, S.EndOfStream):
                    self.terminal = event
                    if event.reason != S.END_REASON_EOS:
                        self.error = self.s.error_of(event)
                    return
                assert isinstance(event, AgentPcm)
                self.frames.append(event)
                self.got_frames.set()
                if grant:
                    await self.s.grant(event.sample_count)
                if cancel_at is not None and len(self.frames) == cancel_at:
                    # Right as this tick's batch arrived: the others' frames of the same tick are in flight.
                    await self.s.cancel("client went away")
                    self.terminal = self.s.terminal
                    return
        except GatewayError as exc:
            self.error = exc
        finally:
            self.s.close()

    async def reached(self, n: int) -> None:
        while len(self.frames) < n:
            self.got_frames.clear()
            await asyncio.wait_for(self.got_frames.wait(), 10)


async def slots_in_use(rig: Rig) -> int:
    stub = stage_pb2_grpc.CodecStub(rig.channel)
    for _ in range(100):
        status = (await stub.Status(S.CodecStatusRequest())).status
        if status.slots_in_use == 0:
            break
        await asyncio.sleep(0.02)
    return status.slots_in_use


def in_order(c: Caller) -> bool:
    return [f.first_frame for f in c.frames] == list(range(len(c.frames)))


async def test_a_cancel_in_the_middle_of_a_tick_ends_that_session_alone(model: MimiModel) -> None:
    async with stage(model, FakeTalker(link=True), sessions=3) as rig:
        pool = await codecs(rig.address)
        a, b, c = (Caller(pool, rig, name) for name in ("a", "bb", "ccc"))
        await asyncio.gather(a.run(30), b.run(1000, cancel_at=6), c.run(30))
        assert b.terminal is not None and b.terminal.reason == S.END_REASON_CANCELLED
        for x in (a, c):
            assert x.error is None and x.terminal is not None and x.terminal.reason == S.END_REASON_EOS
            # Went on past b's cancel (at its 6th frame), in order. Not a fixed count: on a loaded machine the
            # codec may run a tick late and drop that tick's user audio by design (skipped ticks).
            assert len(x.frames) > 6 and in_order(x)
        assert await slots_in_use(rig) == 0
        # All three sessions rode one link each way, far fewer messages than per-session streams would take.
        assert rig.talker.links == 1
        link = pool.replicas[0].link
        assert link is not None and link._conn is not None
        assert link._conn.port.batches < sum(len(x.frames) for x in (a, b, c))
        await pool.close()


async def test_a_codec_killed_mid_tick_fails_only_its_links_sessions(model: MimiModel) -> None:
    async with (
        stage(model, FakeTalker(link=True)) as rig1,
        stage(model, FakeTalker(link=True)) as rig2,
    ):
        pool = await codecs(rig1.address, rig2.address)
        a1, a2 = Caller(pool, rig1, "a1"), Caller(pool, rig1, "a2")
        b = Caller(pool, rig2, "b", replica_index=1)
        runs = [asyncio.ensure_future(x.run(n)) for x, n in ((a1, 1000), (a2, 1000), (b, 40))]
        await a1.reached(5)
        assert rig1.server is not None
        await rig1.server.stop(0)  # the codec is gone, between two of its ticks' batches
        await asyncio.gather(*runs)
        for x in (a1, a2):
            assert x.error is not None and x.error.code is grpc.StatusCode.UNAVAILABLE, x.error
            assert "link to codec" in str(x.error)
        assert pool.replicas[0].down  # as a call of its own that met UNAVAILABLE did
        assert b.error is None and b.terminal is not None and b.terminal.reason == S.END_REASON_EOS
        assert len(b.frames) > 12 and in_order(b)
        assert not pool.replicas[1].down
        await pool.close()


async def test_a_talker_killed_mid_tick_fails_only_its_links_sessions(model: MimiModel) -> None:
    other = FakeTalker(link=True)
    server = grpc.aio.server()
    stage_pb2_grpc.add_TalkerServicer_to_server(other, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    async with stage(model, FakeTalker(link=True), sessions=3) as rig:
        pool = await codecs(rig.address)
        a1, a2 = Caller(pool, rig, "a1"), Caller(pool, rig, "a2")
        b = Caller(pool, rig, "b", talker_address=f"127.0.0.1:{port}")
        runs = [asyncio.ensure_future(x.run(n)) for x, n in ((a1, 1000), (a2, 1000), (b, 40))]
        await a1.reached(5)
        await server.stop(0)  # b's talker dies; a1 and a2 ride the other talker's link
        await b.reached(0)
        await asyncio.gather(*runs[2:])
        assert b.error is not None and b.error.code is grpc.StatusCode.UNAVAILABLE, b.error
        assert "without end_of_stream" in str(b.error) and "link to talker" in str(b.error)
        assert not pool.replicas[0].down  # the codec relayed an in-band error: it is not down
        n1, n2 = len(a1.frames), len(a2.frames)
        await a1.reached(n1 + 10)
        await a2.reached(n2 + 10)
        for x in (a1, a2):
            assert x.error is None and x.terminal is None and in_order(x)
            await x.s.cancel("done")
        await asyncio.gather(*runs[:2])
        assert await slots_in_use(rig) == 0
        await pool.close()


async def test_a_slow_consumer_does_not_stall_the_others_on_its_link(model: MimiModel) -> None:
    async with stage(model, FakeTalker(link=True), sessions=2) as rig:
        pool = await codecs(rig.address)
        # A window of 4 frames: the codec gives up on it before the fake talker outruns its frame credit.
        slow, fast = Caller(pool, rig, "slow", window=4 * SPF), Caller(pool, rig, "fast")

        async def never_reads() -> None:
            # Opened, then nobody reads this session's agent audio nor grants it: its window fills.
            credit = S.Credit(unit=S.CREDIT_UNIT_SAMPLES, amount=slow.window)
            await slow.s.open_duplex(rig.open_msg(request_id="slow", initial_credit=credit))

        await never_reads()
        await fast.run(60)
        assert fast.error is None and fast.terminal is not None and fast.terminal.reason == S.END_REASON_EOS
        assert len(fast.frames) > 30 and in_order(fast)
        # Meanwhile the codec failed the unread session alone, after one window of agent audio.
        end = await asyncio.wait_for(_drain(slow.s), 10)
        assert (
            end.reason == S.END_REASON_ERROR and end.error.code == grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]
        )
        assert "agent audio not read" in end.error.message
        slow.s.close()
        assert await slots_in_use(rig) == 0
        await pool.close()


async def _drain(s: DuplexCodecStream) -> S.EndOfStream:
    samples = 0
    while True:
        event = await s.next_event()
        if isinstance(event, S.EndOfStream):
            assert samples <= 4 * SPF  # what it was granted, never more
            return event
        samples += event.sample_count


async def test_credits_hold_per_request_on_a_shared_link(model: MimiModel) -> None:
    async with stage(model, FakeTalker(link=True, user_credit=2), sessions=2) as rig:
        pool = await codecs(rig.address)
        tight = Caller(pool, rig, "tight", window=3 * SPF)  # three frames of agent audio, never re-granted
        free = Caller(pool, rig, "free")
        await asyncio.gather(tight.run(1000, grant=False), free.run(40))
        # The tight session got exactly its window, then failed alone; the other's grants never leaked to it.
        assert len(tight.frames) == 3
        assert tight.error is not None and tight.error.code is grpc.StatusCode.RESOURCE_EXHAUSTED
        assert free.error is None and free.terminal is not None and len(free.frames) > 12 and in_order(free)
        assert await slots_in_use(rig) == 0
        await pool.close()
