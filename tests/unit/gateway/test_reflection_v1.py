"""gRPC reflection answers as ``grpc.reflection.v1`` and ``grpc.reflection.v1alpha``; both list the voxstage
services and describe them (v1 itself included), and ``gateway.reflection: false`` turns both off."""

from __future__ import annotations

import grpc
import pytest
from gateway_kit import MakeStack
from google.protobuf import descriptor_pb2
from grpc_reflection.v1alpha import reflection_pb2 as wire  # v1's messages are the same, field for field

NAMES = ("grpc.reflection.v1.ServerReflection", "grpc.reflection.v1alpha.ServerReflection")


async def ask(channel: grpc.aio.Channel, service: str, **request: str) -> wire.ServerReflectionResponse:
    call = channel.stream_stream(
        f"/{service}/ServerReflectionInfo",
        request_serializer=wire.ServerReflectionRequest.SerializeToString,
        response_deserializer=wire.ServerReflectionResponse.FromString,
    )
    responses = [r async for r in call(iter([wire.ServerReflectionRequest(**request)]))]
    assert len(responses) == 1
    return responses[0]


@pytest.mark.parametrize("service", NAMES)
async def test_both_reflection_versions_list_and_describe(make_stack: MakeStack, service: str) -> None:
    stack = await make_stack()
    listed = await ask(stack.channel, service, list_services="")
    names = {s.name for s in listed.list_services_response.service}
    assert {"voxstage.v1.Speech", "grpc.health.v1.Health", *NAMES} <= names
    for symbol in ("voxstage.v1.Speech", "grpc.reflection.v1.ServerReflection"):
        described = await ask(stack.channel, service, file_containing_symbol=symbol)
        files = [
            descriptor_pb2.FileDescriptorProto.FromString(b)
            for b in described.file_descriptor_response.file_descriptor_proto
        ]
        services = {f"{f.package}.{s.name}" for f in files for s in f.service}
        assert symbol in services, (symbol, [f.name for f in files])


async def test_reflection_off_turns_both_off(make_stack: MakeStack) -> None:
    stack = await make_stack(overrides=["gateway.reflection=false"])
    for service in NAMES:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await ask(stack.channel, service, list_services="")
        assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED
