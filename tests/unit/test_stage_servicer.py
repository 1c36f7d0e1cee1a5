"""The shared Stream handler's end of call (docs/protocol.md §5): after the terminal it keeps the call open
until the peer half-closes, so a credit the peer writes meanwhile never lands in a finished call; a peer that
never half-closes is let go after the grace."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from voxstage.config import ChunkPlan
from voxstage.internal.v1 import stage_pb2
from voxstage.stage import servicer as stage_servicer
from voxstage.stage.servicer import StageServicer
from voxstage.stage.stream import StageStream


class _Stream(StageStream):
    role = "codec"
    peer = "gateway"

    async def _handle(self, msg: Any) -> None:
        if msg.WhichOneof("request") == "end_of_input":
            self.end_of_input = True
            self._send_terminal(stage_pb2.END_REASON_EOS, None, frames=0, queued=None)

    def _response(self, **fields: Any) -> Any:
        return stage_pb2.CodecStreamResponse(**fields)

    def close(self) -> None:
        pass


class _Servicer(StageServicer[_Stream]):
    def _new_stream(self, context: Any) -> _Stream:
        return _Stream("k")


async def _peer(half_close: asyncio.Event, seen: list[str]) -> AsyncIterator[Any]:
    yield stage_pb2.CodecStreamRequest(end_of_input=stage_pb2.EndOfInput())
    await half_close.wait()
    seen.append("credit")  # written after the terminal, before the half-close: must still be taken
    yield stage_pb2.CodecStreamRequest(credit=stage_pb2.Credit(amount=1))


def _servicer() -> _Servicer:
    return _Servicer(None, plan=ChunkPlan(1, 1, 0, whole_take=False), shm_writer=None, identity={})


async def test_call_ends_only_after_the_peer_half_closes() -> None:
    half_close, seen = asyncio.Event(), []
    handler = aiter(_servicer().Stream(_peer(half_close, seen), None))  # type: ignore[arg-type]
    msg = await anext(handler)
    assert msg.HasField("end_of_stream")
    ending = asyncio.ensure_future(anext(handler, None))
    await asyncio.sleep(0.2)
    assert not ending.done()  # still open: the peer has not half-closed
    half_close.set()
    assert await asyncio.wait_for(ending, 1.0) is None and seen == ["credit"]


async def test_a_peer_that_never_half_closes_is_let_go(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stage_servicer, "PEER_CLOSE_GRACE_S", 0.2)
    handler = aiter(_servicer().Stream(_peer(asyncio.Event(), []), None))  # type: ignore[arg-type]
    assert (await anext(handler)).HasField("end_of_stream")
    assert await asyncio.wait_for(anext(handler, None), 2.0) is None
