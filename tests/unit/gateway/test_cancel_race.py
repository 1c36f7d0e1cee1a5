"""Issue 26, defect 5: a client that cancels mid-stream while a shared-memory chunk is on its way.

The codec ends the cancelled stream and takes its shared-memory slots back, so a chunk the gateway reads
while cancelling may no longer be there (``StaleShmReference``). It was to be dropped anyway: the request
ends as cancelled, with no ERROR line, instead of "request failed" and ``outcome=error code=INTERNAL``. A
stale chunk outside a cancel means the codec took its regions back (a restart): UNAVAILABLE, not INTERNAL.
The race (2 of 143 cancels in the issue's probe) is forced here: when the gateway starts cancelling, one
more chunk is on its way and every read fails as a released slot does (the fake codec sends inline
payloads; the shared-memory reader itself is tested in tests/unit/transport). The race belongs to a
``Stream`` call per request, where each chunk is its own shared-memory loan; on a link the chunk rides the
tick's slab, which the link's reader copies out before any request sees it, so the codec here offers no link.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import grpc
import pytest
from gateway_fakes import FakeCodec
from gateway_kit import MakeStack, until

from gateway import upstream
from voxstage.internal.v1 import stage_pb2
from voxstage.transport.shm_layout import StaleShmReference
from voxstage.v1 import speech_pb2

PCM = speech_pb2.AUDIO_ENCODING_PCM_S16LE


def speech_chunk() -> stage_pb2.PcmChunk:
    data = stage_pb2.Payload(inline=bytes(3840))
    return stage_pb2.PcmChunk(data=data, format=stage_pb2.PCM_FORMAT_S16LE, sample_count=1920)


def stale_after(monkeypatch: pytest.MonkeyPatch, gone: asyncio.Event) -> list[int]:
    real = upstream.read_payload
    raised: list[int] = []

    def read(payload: Any, reader: Any) -> Any:
        if gone.is_set():
            raised.append(1)
            raise StaleShmReference("voxstage-1-x slot 3 was released")
        return real(payload, reader)

    monkeypatch.setattr(upstream, "read_payload", read)
    return raised


async def test_a_chunk_gone_while_cancelling_ends_the_request_as_cancelled(
    make_stack: MakeStack, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    stack = await make_stack(FakeCodec(frame_delay_s=0.01, link=False))
    gone = asyncio.Event()
    raised = stale_after(monkeypatch, gone)

    async def requests():  # type: ignore[no-untyped-def]
        yield speech_pb2.StreamingSynthesizeRequest(config=speech_pb2.SynthesisConfig(encoding=PCM))
        yield speech_pb2.StreamingSynthesizeRequest(text="a long sentence that takes a while " * 4)
        yield speech_pb2.StreamingSynthesizeRequest(flush=speech_pb2.Flush())
        await asyncio.sleep(60)

    real_cancel = upstream.CodecStream.cancel

    async def cancel(self: upstream.CodecStream, reason: str) -> None:
        gone.set()
        chunk = speech_chunk()
        self._deliver(stage_pb2.CodecStreamResponse(pcm=chunk))  # noqa: SLF001 - the one in flight
        await real_cancel(self, reason)

    monkeypatch.setattr(upstream.CodecStream, "cancel", cancel)
    caplog.set_level(logging.INFO)
    call = stack.stub.StreamingSynthesize(requests())
    async for reply in call:
        if reply.HasField("audio"):
            break
    call.cancel()
    await until(lambda: stack.codec.active == 0 and stack.gateway.core.admission.active == 0)
    await until(lambda: "outcome=" in caplog.text)
    assert raised, "no chunk was read while cancelling: the race was not exercised"
    assert (stack.codec.streams, stack.codec.links) == (1, 0)  # a call of its own, as to a codec before links
    assert "request failed" not in caplog.text and "StaleShmReference" not in caplog.text
    access = [r.getMessage() for r in caplog.records if r.name == "voxstage.gateway.access"]
    assert access and "outcome=cancelled" in access[-1], access


async def test_a_chunk_gone_outside_a_cancel_is_unavailable_not_internal(
    make_stack: MakeStack, monkeypatch: pytest.MonkeyPatch
) -> None:
    stack = await make_stack(FakeCodec(link=False))
    gone = asyncio.Event()
    gone.set()
    stale_after(monkeypatch, gone)
    request = speech_pb2.SynthesizeRequest(config=speech_pb2.SynthesisConfig(encoding=PCM), text="hello")
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stack.stub.Synthesize(request, timeout=10)
    assert err.value.code() is grpc.StatusCode.UNAVAILABLE, err.value.details()
    assert "no longer readable" in (err.value.details() or "")
