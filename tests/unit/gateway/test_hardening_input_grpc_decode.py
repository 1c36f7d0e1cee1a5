"""Bytes that are not a protobuf, sent to the public gRPC port: INVALID_ARGUMENT naming the message type,
and no traceback in the log (issue 15: UNKNOWN plus a logged traceback per request)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import grpc
import pytest
from gateway_kit import MakeStack

from voxstage.v1 import speech_pb2

# A field-1 length prefix far past the end of the message: no protobuf parser accepts it.
GARBAGE = b"\x0a\xff\xff\xff\x0fnot a protobuf"
PCM = speech_pb2.AUDIO_ENCODING_PCM_S16LE


def _tracebacks(caplog: pytest.LogCaptureFixture) -> list[str]:
    # The gateway's and grpc's loggers (grpc.aio logs a servicer's exception as grpc._cython.cygrpc).
    return [
        f"{r.name}: {r.getMessage()[:200]}"
        for r in caplog.records
        if r.name.startswith(("voxstage", "grpc"))
        and (r.exc_info or r.exc_text or r.levelno >= logging.ERROR)
    ]


async def _stream(channel: grpc.aio.Channel, method: str, messages: list[bytes]) -> grpc.aio.AioRpcError:
    async def gen() -> AsyncIterator[bytes]:
        for m in messages:
            yield m

    call = channel.stream_stream(f"/voxstage.v1.Speech/{method}")(gen())  # no (de)serializers: raw bytes
    with pytest.raises(grpc.aio.AioRpcError) as err:
        async for _ in call:
            pass
    return err.value


async def test_garbage_requests_get_invalid_argument_without_a_traceback(
    make_stack: MakeStack, caplog: pytest.LogCaptureFixture
) -> None:
    stack = await make_stack()
    caplog.set_level(logging.DEBUG)
    for method, kind in (("Synthesize", "SynthesizeRequest"), ("ListVoices", "ListVoicesRequest")):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stack.channel.unary_unary(f"/voxstage.v1.Speech/{method}")(GARBAGE)
        assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT, (method, err.value)
        assert f"voxstage.v1.{kind}" in (err.value.details() or ""), err.value.details()
    # A garbage first message, and a garbage message after a valid config.
    config = speech_pb2.StreamingSynthesizeRequest(config=speech_pb2.SynthesisConfig(encoding=PCM))
    for messages in ([GARBAGE], [config.SerializeToString(), GARBAGE]):
        rpc = await _stream(stack.channel, "StreamingSynthesize", messages)
        assert rpc.code() is grpc.StatusCode.INVALID_ARGUMENT, rpc
        assert "voxstage.v1.StreamingSynthesizeRequest" in (rpc.details() or ""), rpc.details()
    assert not _tracebacks(caplog), _tracebacks(caplog)
    # The port still serves well-formed requests.
    reply = await stack.stub.Synthesize(
        speech_pb2.SynthesizeRequest(config=speech_pb2.SynthesisConfig(encoding=PCM), text="ok")
    )
    assert reply.audio


async def test_garbage_converse_message_gets_invalid_argument(
    make_duplex_stack: MakeStack, caplog: pytest.LogCaptureFixture
) -> None:
    stack = await make_duplex_stack()
    caplog.set_level(logging.DEBUG)
    rpc = await _stream(stack.channel, "Converse", [GARBAGE])
    assert rpc.code() is grpc.StatusCode.INVALID_ARGUMENT, rpc
    assert "voxstage.v1.ConverseRequest" in (rpc.details() or ""), rpc.details()
    assert not _tracebacks(caplog), _tracebacks(caplog)
