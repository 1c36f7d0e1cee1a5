"""The TTS relay's stall clock (services/codec/relay.py, docs/protocol.md §8): it restarts at every message
from the talker, runs only while the talker owes output (credit held, input complete), and a talker that
stays silent that long fails the request with DEADLINE_EXCEEDED. One timer per stream serves it."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import numpy as np
import pytest

from services.codec.relay import TalkerRelay
from services.codec.upstream import TalkerPool
from voxstage import wire
from voxstage.config import ConnectorExtra
from voxstage.internal.v1 import stage_pb2 as S

STALL_S = 0.2  # connector_get_max_wait 20 x connector_get_sleep_s 0.01


class Stream:
    """What the relay reads of its codec stream here: settings, the codebook, frames in, failure out."""

    def __init__(self) -> None:
        extra = ConnectorExtra(connector_get_max_wait=20)
        self.srv = SimpleNamespace(stream_config=extra, shm_writer=None)
        self.rt = SimpleNamespace(codebook_size=2048)
        self.frames = 0
        self.failures: list[tuple[str, str]] = []

    def frames_in(self, codes: np.ndarray) -> None:
        self.frames += codes.shape[0]

    def fail(self, code: str, message: str) -> None:
        self.failures.append((code, message))


def relay(stream: Stream, credit: int) -> TalkerRelay:
    r = TalkerRelay(stream, TalkerPool(None), "127.0.0.1:1", None)  # type: ignore[arg-type]
    r.opened.set_result(S.StreamOpened())
    r.outstanding = credit
    r.input_given(ended=True)
    return r


def frame(first: int) -> S.CodecFrames:
    codes = np.zeros((1, 16), np.int64)
    return S.CodecFrames(
        first_frame=first, frame_count=1, num_groups=16, codes=S.Payload(inline=wire.codes_to_bytes(codes))
    )


@pytest.mark.asyncio
async def test_frames_more_often_than_the_timeout_keep_it_from_firing_and_silence_fires_it() -> None:
    stream = Stream()
    r = relay(stream, credit=100)
    for i in range(10):  # 0.5 s of frames 50 ms apart: 2.5 timeouts, never one without a frame
        r._frames(frame(i))  # noqa: SLF001 - the reader's handling of one message
        await asyncio.sleep(STALL_S / 4)
    assert stream.failures == [] and stream.frames == 10
    await asyncio.sleep(STALL_S * 2)
    ((code, message),) = stream.failures
    assert code == "DEADLINE_EXCEEDED" and "stall timeout" in message
    r.close()


@pytest.mark.asyncio
async def test_the_clock_stops_while_the_talker_holds_no_credit_and_restarts_with_a_grant() -> None:
    stream = Stream()
    r = relay(stream, credit=1)
    r._frames(frame(0))  # noqa: SLF001 - its last credit: nothing is owed now
    await asyncio.sleep(STALL_S * 2)
    assert stream.failures == []
    r.grant(5)
    await asyncio.sleep(STALL_S / 2)
    assert stream.failures == []
    await asyncio.sleep(STALL_S * 1.5)
    assert [code for code, _ in stream.failures] == ["DEADLINE_EXCEEDED"]
    r.close()
