"""The shape of the public and internal APIs that other code (and clients) rely on."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf.descriptor import Descriptor, EnumDescriptor, FileDescriptor

from voxstage.internal.v1 import stage_pb2, stage_pb2_grpc
from voxstage.v1 import speech_pb2

REPO = Path(__file__).resolve().parents[3]


def _methods(file: FileDescriptor, service: str) -> dict[str, tuple[bool, bool]]:
    svc = file.services_by_name[service]
    return {m.name: (m.client_streaming, m.server_streaming) for m in svc.methods}


def test_rpc_cardinalities_are_the_published_ones() -> None:
    # Changing an RPC's cardinality breaks every client silently (the Riva SynthesizeOnline lesson).
    assert _methods(speech_pb2.DESCRIPTOR, "Speech") == {
        "Synthesize": (False, False),
        "StreamingSynthesize": (True, True),
        "ListVoices": (False, False),
        "Converse": (True, True),
        "CreateVoice": (False, False),
        "GetVoice": (False, False),
        "DeleteVoice": (False, False),
    }
    link = {"Stream": (True, True), "Status": (False, False), "Link": (True, True)}
    assert _methods(stage_pb2.DESCRIPTOR, "Codec") == {**link, "EncodeVoice": (False, False)}
    assert _methods(stage_pb2.DESCRIPTOR, "Talker") == link


def _all_enums(file: FileDescriptor) -> list[EnumDescriptor]:
    enums = list(file.enum_types_by_name.values())
    pending: list[Descriptor] = list(file.message_types_by_name.values())
    while pending:
        msg = pending.pop()
        enums += msg.enum_types
        pending += msg.nested_types
    return enums


@pytest.mark.parametrize("file", [speech_pb2.DESCRIPTOR, stage_pb2.DESCRIPTOR], ids=lambda f: f.name)
def test_every_enum_zero_value_is_unspecified(file: FileDescriptor) -> None:
    enums = _all_enums(file)
    assert enums
    for enum in enums:
        zero = enum.values_by_number[0].name
        assert zero.endswith("_UNSPECIFIED"), f"{enum.full_name} zero value is {zero}"


def test_streaming_request_arms() -> None:
    oneof = speech_pb2.StreamingSynthesizeRequest.DESCRIPTOR.oneofs_by_name["request"]
    assert [f.name for f in oneof.fields] == ["config", "text", "flush"]
    msg = speech_pb2.StreamingSynthesizeRequest(text="hello")
    back = speech_pb2.StreamingSynthesizeRequest.FromString(msg.SerializeToString())
    assert back.WhichOneof("request") == "text" and back.text == "hello"


def test_unset_sampling_overrides_are_distinguishable_from_zero() -> None:
    # temperature 0 is greedy, not "use the deploy default": presence must survive the wire.
    sent = speech_pb2.SamplingParams(temperature=0.0)
    got = speech_pb2.SamplingParams.FromString(sent.SerializeToString())
    assert got.HasField("temperature") and not got.HasField("top_k")


def test_large_internal_payloads_go_through_payload() -> None:
    payload = stage_pb2.Payload.DESCRIPTOR
    cases: list[tuple[Any, str]] = [
        (stage_pb2.CodecFrames, "codes"),
        (stage_pb2.PcmChunk, "data"),
        (stage_pb2.VoiceReference, "audio"),
        (stage_pb2.VoiceReference, "x_vector"),
    ]
    for msg, field in cases:
        assert msg.DESCRIPTOR.fields_by_name[field].message_type is payload, f"{msg.__name__}.{field}"
    body = payload.oneofs_by_name["body"]
    assert [f.name for f in body.fields] == ["inline", "shm"]


def test_every_stream_carries_the_protocol_arms() -> None:
    expected_down = {"open", "text", "flush", "end_of_input", "credit", "cancel", "shm_ack"}
    expected_up = {"opened", "segment_done", "credit", "end_of_stream", "shm_ack"}
    streams: list[tuple[Any, Any, str, str]] = [
        (stage_pb2.CodecStreamRequest, stage_pb2.CodecStreamResponse, "user_audio", "pcm"),
        (stage_pb2.TalkerStreamRequest, stage_pb2.TalkerStreamResponse, "user_codes", "frames"),
    ]
    for request, response, data_in, data_out in streams:
        down = {f.name for f in request.DESCRIPTOR.oneofs_by_name["request"].fields}
        up = {f.name for f in response.DESCRIPTOR.oneofs_by_name["response"].fields}
        assert down == expected_down | {data_in}
        assert up == expected_up | {data_out}


class _Talker(stage_pb2_grpc.TalkerServicer):
    async def Status(self, request: Any, context: Any) -> stage_pb2.TalkerStatusResponse:
        requests = [stage_pb2.RequestState(request_id="r1", slot=0)] if request.include_requests else []
        return stage_pb2.TalkerStatusResponse(
            status=stage_pb2.StageStatus(ready=True, family="qwen3_tts", tick=7, requests=requests)
        )

    async def Stream(
        self, request_iterator: Any, context: Any
    ) -> AsyncIterator[stage_pb2.TalkerStreamResponse]:
        async for msg in request_iterator:
            if msg.WhichOneof("request") == "open":
                yield stage_pb2.TalkerStreamResponse(
                    opened=stage_pb2.StreamOpened(request_id=msg.open.request_id)
                )
            elif msg.WhichOneof("request") == "end_of_input":
                end = stage_pb2.EndOfStream(reason=stage_pb2.END_REASON_EOS)
                yield stage_pb2.TalkerStreamResponse(end_of_stream=end)
                return


async def test_generated_service_code_round_trips_over_grpc_aio() -> None:
    # The checked-in grpc code must work with the pinned grpcio: method paths, (de)serializers, cardinality.
    server = grpc.aio.server()
    stage_pb2_grpc.add_TalkerServicer_to_server(_Talker(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            talker = stage_pb2_grpc.TalkerStub(channel)
            status = (
                await talker.Status(stage_pb2.TalkerStatusRequest(include_requests=True), timeout=10)
            ).status
            assert (status.ready, status.family, status.tick) == (True, "qwen3_tts", 7)
            assert [r.request_id for r in status.requests] == ["r1"]

            async def requests() -> AsyncIterator[stage_pb2.TalkerStreamRequest]:
                yield stage_pb2.TalkerStreamRequest(open=stage_pb2.StreamOpen(request_id="r2"))
                yield stage_pb2.TalkerStreamRequest(end_of_input=stage_pb2.EndOfInput())

            arms = [m.WhichOneof("response") async for m in talker.Stream(requests(), timeout=10)]
            assert arms == ["opened", "end_of_stream"]
    finally:
        await server.stop(None)


def _buf() -> str | None:
    return os.environ.get("VOXSTAGE_BUF") or shutil.which("buf")


@pytest.mark.skipif(_buf() is None, reason="buf CLI not found (npm i @bufbuild/buf, or set VOXSTAGE_BUF)")
def test_buf_lint_passes() -> None:
    buf = _buf()
    assert buf is not None
    run = subprocess.run([buf, "lint"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr


@pytest.mark.skipif(_buf() is None, reason="buf CLI not found (npm i @bufbuild/buf, or set VOXSTAGE_BUF)")
def test_buf_breaking_against_the_baseline() -> None:
    # Stages roll out one deployment at a time, so protos/ may change only additively (buf.yaml: FILE rules)
    # against the image of the last landed change. After an additive change, rebuild the baseline:
    #   buf build -o tests/fixtures/proto/baseline.binpb
    buf = _buf()
    assert buf is not None
    baseline = "tests/fixtures/proto/baseline.binpb"
    run = subprocess.run(
        [buf, "breaking", "--against", baseline], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stdout + run.stderr
