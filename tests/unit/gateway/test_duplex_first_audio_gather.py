"""``duplex_session.first_audio_gather_s``: the gateway holds a session's first agent audio until that much
has come and sends it together, later audio as it comes; audio gathered when the session ends still goes
out before the end; a bad value is refused naming the key."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from duplex_fakes import FakeDuplexCodec
from gateway_kit import DUPLEX_SEED, MakeStack
from test_duplex_converse import FRAME_BYTES, Caller, append, join_count, tone

from voxstage.config import ConfigError, DuplexSessionConfig, load_deploy_config
from voxstage.duplex import FRAME_SECONDS

GATHER = f"duplex_session.first_audio_gather_s={2 * FRAME_SECONDS}"  # two frames


async def test_the_first_audio_waits_for_the_second_frame_then_goes_together(
    make_duplex_stack: MakeStack,
) -> None:
    stack = await make_duplex_stack(overrides=[GATHER])
    first_audio = join_count("first_audio")
    c = Caller(stack)
    await c.next("session_created")
    audio: asyncio.Queue[bytes] = asyncio.Queue()

    async def read() -> None:  # a read cancelled by a timeout would cancel the call: one reader throughout
        while (reply := await c.call.read()) is not grpc.aio.EOF:
            if reply.HasField("response_output_audio_delta"):
                audio.put_nowait(reply.response_output_audio_delta.delta)

    reader = asyncio.create_task(read())
    frame = tone(1.0)[:FRAME_BYTES]
    c.send(append(frame))  # the codec double answers every user frame with one agent frame at once
    await asyncio.sleep(0.4)
    assert audio.empty() and join_count("first_audio") == first_audio  # held: not first audio yet
    c.send(append(frame))
    async with asyncio.timeout(5):
        got = [await audio.get(), await audio.get()]
    assert [len(d) for d in got] == [FRAME_BYTES] * 2 and join_count("first_audio") == first_audio + 1
    c.send(append(frame))  # from here each frame goes as it comes
    async with asyncio.timeout(5):
        assert len(await audio.get()) == FRAME_BYTES
    c.send(None)
    async with asyncio.timeout(5):
        await reader
    assert await c.call.code() is grpc.StatusCode.OK and audio.empty()


async def test_audio_gathered_when_the_session_fails_goes_out_before_the_error(
    make_duplex_stack: MakeStack,
) -> None:
    stack = await make_duplex_stack(FakeDuplexCodec(fail_after_frames=1), overrides=[GATHER])
    c = Caller(stack)
    await c.next("session_created")
    c.send(append(tone(1.0)[:FRAME_BYTES]))
    audio = await c.next("response_output_audio_delta")
    assert len(audio.response_output_audio_delta.delta) == FRAME_BYTES
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await c.rest()
    assert err.value.code() is grpc.StatusCode.INTERNAL


def test_the_default_sends_each_frame_as_it_comes_and_bad_values_are_refused() -> None:
    assert DuplexSessionConfig().first_audio_gather_s == 0.0
    for value in ("-0.1", "1.5"):
        with pytest.raises(ConfigError, match="first_audio_gather_s"):
            load_deploy_config(
                DUPLEX_SEED, platform="cpu", overrides=[f"duplex_session.first_audio_gather_s={value}"]
            )
