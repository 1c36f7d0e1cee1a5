"""``grpc.reflection.v1.ServerReflection`` next to the ``v1alpha`` service that grpcio-reflection serves.

Newer clients (grpcurl 1.9+, Postman, grpc-js tooling) ask for v1 first. grpcio-reflection (1.84 here) only
ships v1alpha, whose messages are field for field the same as v1's: the v1 service is the same servicer
mounted under the v1 name. So that reflection can describe the v1 service itself, its file is registered in
the default descriptor pool as a copy of v1alpha's file with the package renamed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool
from grpc_reflection.v1alpha import _async as reflection_async
from grpc_reflection.v1alpha import reflection_pb2 as alpha_pb2

from voxstage.server import ServiceBinding

ALPHA_PACKAGE = "grpc.reflection.v1alpha"
V1_PACKAGE = "grpc.reflection.v1"
SERVICE_NAME = f"{V1_PACKAGE}.ServerReflection"
V1_FILE = "grpc/reflection/v1/reflection.proto"


def _register_v1_file() -> None:
    pool = descriptor_pool.Default()
    try:
        pool.FindFileByName(V1_FILE)
        return  # registered already (by an earlier gateway in this process, or by a v1 stub module)
    except KeyError:
        pass
    proto = descriptor_pb2.FileDescriptorProto()
    alpha_pb2.DESCRIPTOR.CopyToProto(proto)
    proto.name, proto.package = V1_FILE, V1_PACKAGE
    proto.options.Clear()  # v1alpha's Java/C# package options name the old package
    for message in proto.message_type:
        for f in message.field:
            if f.type_name:
                f.type_name = f.type_name.replace(f".{ALPHA_PACKAGE}.", f".{V1_PACKAGE}.")
    for service in proto.service:
        for method in service.method:
            method.input_type = method.input_type.replace(f".{ALPHA_PACKAGE}.", f".{V1_PACKAGE}.")
            method.output_type = method.output_type.replace(f".{ALPHA_PACKAGE}.", f".{V1_PACKAGE}.")
    pool.Add(proto)


def _mount(servicer: Any, server: grpc.aio.Server) -> None:
    # The wire format is v1alpha's, so the v1alpha message classes (de)serialize v1 calls unchanged.
    handler = grpc.stream_stream_rpc_method_handler(
        servicer.ServerReflectionInfo,
        request_deserializer=alpha_pb2.ServerReflectionRequest.FromString,
        response_serializer=alpha_pb2.ServerReflectionResponse.SerializeToString,
    )
    handlers = {"ServerReflectionInfo": handler}
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME, handlers),))
    server.add_registered_method_handlers(SERVICE_NAME, handlers)


def reflection_v1_binding(listed: Sequence[str]) -> ServiceBinding:
    """The v1 service, listing ``listed`` (every service on the port, this one included)."""
    _register_v1_file()
    return ServiceBinding(SERVICE_NAME, reflection_async.ReflectionServicer(tuple(listed)), _mount)
