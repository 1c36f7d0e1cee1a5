"""What a stage counts of its transport: slots lent and not yet acked (``voxstage_shm_slots_lent``), and each
payload byte once, whether its request has a call of its own or rides a link (docs/protocol.md §12)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from voxstage import metrics
from voxstage.config import ChunkPlan
from voxstage.internal.v1 import stage_pb2
from voxstage.link.server import LinkContext
from voxstage.stage.servicer import StageServicer
from voxstage.stage.stream import StageStream
from voxstage.transport.shm import ShmRef, ShmWriter

pytestmark = pytest.mark.skipif(not Path("/dev/shm").is_dir(), reason="needs a Linux /dev/shm")


class _Stream(StageStream):
    role = "talker"
    peer = "codec"

    def close(self) -> None:
        pass


class _Servicer(StageServicer[_Stream]):
    def _new_stream(self, context: Any) -> _Stream:
        return _Stream("k")


@pytest.fixture
def writer(tmp_path: Path) -> Iterator[ShmWriter]:
    w = ShmWriter(threshold_bytes=64, region_bytes=1 << 20, max_total_bytes=8 << 20, shm_dir=tmp_path)
    yield w
    w.close()


def lent() -> float | None:
    return metrics.REGISTRY.get_sample_value("voxstage_shm_slots_lent")


def sent(path: str) -> float:
    return metrics.REGISTRY.get_sample_value("voxstage_transport_bytes_total", {"path": path}) or 0.0


def test_slots_lent_rise_with_each_loan_and_fall_with_its_ack(writer: ShmWriter) -> None:
    _Servicer(None, plan=ChunkPlan(1, 1, 0, whole_take=False), shm_writer=writer, identity={})
    sender = writer.sender(peer_readable=True)
    refs = [sender.place(os.urandom(1000)) for _ in range(3)]
    assert all(isinstance(r, ShmRef) for r in refs) and lent() == 3
    sender.ack(refs[:2])  # type: ignore[arg-type]
    assert lent() == 1
    sender.close()  # the reader went away: the rest is reclaimed
    assert lent() == 0


@pytest.mark.parametrize("on_link", [False, True], ids=["call", "link"])
def test_a_requests_payload_is_counted_once(writer: ShmWriter, on_link: bool) -> None:
    _Servicer(None, plan=ChunkPlan(1, 1, 0, whole_take=False), shm_writer=writer, identity={})
    stream = _Stream("k")
    stream.on_link = on_link
    op = stage_pb2.StreamOpen()
    op.transport.verified_peer_probe = "" if on_link else writer.probe_region  # a link's open offers none
    stream._lend_shm(writer, op)  # noqa: SLF001 - what each stage's open does
    before = sent("shm"), sent("inline")
    payload = stream.loans.payload(os.urandom(1000))
    after = sent("shm"), sent("inline")
    if on_link:
        # Inline in the request's message; the link counts it once, in its tick's slab (voxstage.link.port).
        assert payload.WhichOneof("body") == "inline" and after == before and lent() == 0
    else:
        assert payload.WhichOneof("body") == "shm" and after == (before[0] + 1000, before[1]) and lent() == 1
    stream.loans.close()


def _emit(msg: Any) -> None:
    """A link's emitter (``LinkSession`` gives each request one)."""


@pytest.mark.parametrize("context", [None, LinkContext(0, _emit)], ids=["call", "link"])
async def test_a_stream_knows_whether_it_rides_a_link_from_its_context(context: Any) -> None:
    made: list[_Stream] = []

    class _Recording(_Servicer):
        def _new_stream(self, context: Any) -> _Stream:
            made.append(_Stream("k"))
            return made[-1]

    async def silent() -> AsyncIterator[Any]:
        await asyncio.Event().wait()
        yield None

    servicer = _Recording(None, plan=ChunkPlan(1, 1, 0, whole_take=False), shm_writer=None, identity={})
    handler = asyncio.ensure_future(anext(aiter(servicer.Stream(silent(), context))))
    await asyncio.sleep(0.01)
    handler.cancel()
    assert [s.on_link for s in made] == [context is not None]
    # On a link the stream takes the link's shortcuts both ways (docs/protocol.md §12).
    assert [s.outbox.sink for s in made] == [_emit if context is not None else None]
    if context is not None:
        assert context.take == made[0].take
