"""Replica health from evidence (issue 15, part 1): a per-stream error fails that stream only.

A stream that breaks with INTERNAL, UNKNOWN or RESOURCE_EXHAUSTED (or ends without a terminal) says nothing
about whether the codec is up, so the replica stays routable and the next request goes straight through. A
dead address (connection refused) is still marked down, and a failed ``Status`` probe still is.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import grpc
import pytest
from gateway_fakes import DROP_MARKER, FakeCodec, expected_samples
from gateway_kit import MakeStack

from voxstage.v1 import speech_pb2

PCM = speech_pb2.AUDIO_ENCODING_PCM_S16LE


@dataclass
class AbortingCodec(FakeCodec):
    """A codec whose next streams (one per queued code) abort with that gRPC status after the first PCM:
    the transport-level error a single stream can end with while the server itself is fine (on the link,
    that request's ``end`` with the status; on a call of its own, the call's status)."""

    abort_codes: list[grpc.StatusCode] = field(default_factory=list)

    async def _serve(self, request_iterator: AsyncIterator[Any], context: Any) -> AsyncIterator[Any]:
        code = self.abort_codes.pop(0) if self.abort_codes else None
        async with contextlib.aclosing(super()._serve(request_iterator, context)) as inner:
            async for msg in inner:
                yield msg
                if code is not None and msg.HasField("pcm"):
                    await context.abort(code, "scripted per-stream failure")


def request(text: str) -> speech_pb2.SynthesizeRequest:
    return speech_pb2.SynthesizeRequest(config=speech_pb2.SynthesisConfig(encoding=PCM), text=text)


@pytest.mark.parametrize("link", [True, False], ids=["link", "stream"])
@pytest.mark.parametrize(
    "code",
    [grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN, grpc.StatusCode.RESOURCE_EXHAUSTED],
    ids=lambda c: c.name,
)
async def test_a_per_stream_error_leaves_the_only_codec_routable(
    make_stack: MakeStack, code: grpc.StatusCode, link: bool
) -> None:
    codec = AbortingCodec(abort_codes=[code], link=link)
    stack = await make_stack(codec, probe_s=5.0)  # no periodic probe could hide a wrong mark-down
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stack.stub.Synthesize(request("this one breaks"))
    # That stream still fails, naming the transport error (grpc.aio may report an aborted generator's status
    # as INTERNAL, so the code named is not always the one scripted).
    assert "failed: " in (err.value.details() or "")
    replica = stack.gateway.core.codecs.replicas[0]
    assert not replica.down, replica.down_reason
    # The very next request goes through at once: no 503 window behind one broken stream.
    start = time.monotonic()
    reply = await stack.stub.Synthesize(request("next one"))
    assert len(reply.audio) == 2 * expected_samples("next one")
    assert time.monotonic() - start < 1.0
    assert stack.gateway.core.ready
    # Both requests rode the link when the codec offers one, else a call each.
    assert (codec.links, codec.streams) == ((1, 0) if link else (0, 2))


async def test_sequential_requests_survive_interleaved_stream_errors(make_stack: MakeStack) -> None:
    codec = AbortingCodec()
    stack = await make_stack(codec, probe_s=5.0)
    failed = 0
    for i in range(20):
        if i % 2 == 0:
            codec.abort_codes.append(grpc.StatusCode.INTERNAL)
        try:
            await stack.stub.Synthesize(request("short"))
        except grpc.aio.AioRpcError:
            failed += 1
    assert failed == 10  # exactly the scripted ones; before the fix every request after one also got 503


async def test_a_stream_without_terminal_leaves_the_codec_routable(make_stack: MakeStack) -> None:
    stack = await make_stack(probe_s=5.0)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stack.stub.Synthesize(request(f"abc {DROP_MARKER}"))
    assert err.value.code() is grpc.StatusCode.UNAVAILABLE
    assert not stack.gateway.core.codecs.replicas[0].down
    reply = await stack.stub.Synthesize(request("fine again"))
    assert len(reply.audio) == 2 * expected_samples("fine again")


async def test_a_dead_address_is_still_marked_down(make_stack: MakeStack) -> None:
    stack = await make_stack(probe_s=5.0)
    await stack.codecs[0].server.stop(0)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stack.stub.Synthesize(request("nobody home"))
    assert err.value.code() is grpc.StatusCode.UNAVAILABLE
    replica = stack.gateway.core.codecs.replicas[0]
    assert replica.down and "UNAVAILABLE" in replica.down_reason
    assert not stack.gateway.core.ready
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stack.stub.Synthesize(request("still nobody"))
    assert "no codec replica is available" in (err.value.details() or "")


async def test_a_failed_status_probe_marks_down(make_stack: MakeStack) -> None:
    stack = await make_stack(probe_s=5.0)
    pool = stack.gateway.core.codecs
    await stack.codecs[0].server.stop(0)
    await pool.probe(pool.replicas[0])
    assert pool.replicas[0].down and pool.replicas[0].down_reason.startswith("Status failed: UNAVAILABLE")
