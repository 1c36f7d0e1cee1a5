"""One access line per request at the gateway (logger ``voxstage.gateway.access``): its id, API, model, voice,
outcome, time to first audio and duration, for served and refused requests alike."""

from __future__ import annotations

import logging
import re

import grpc
import pytest
from gateway_kit import MakeStack

from voxstage.v1 import speech_pb2

LINE = re.compile(
    r"request id=(\S+) api=(\S+) model=(\S+) voice=(\S+) outcome=(\S+) ttfa_ms=(\S+) duration_ms=([\d.]+) "
    r"audio_s=([\d.]+)"
)


def _lines(caplog: pytest.LogCaptureFixture) -> list[tuple[str, ...]]:
    return [
        m.groups()
        for r in caplog.records
        if r.name == "voxstage.gateway.access" and (m := LINE.match(r.message))
    ]


async def test_served_and_refused_requests_each_log_one_line(
    make_stack: MakeStack, caplog: pytest.LogCaptureFixture
) -> None:
    stack = await make_stack()
    caplog.set_level(logging.INFO, logger="voxstage.gateway.access")
    config = speech_pb2.SynthesisConfig(encoding=speech_pb2.AUDIO_ENCODING_PCM_S16LE, voice="ryan")
    await stack.stub.Synthesize(speech_pb2.SynthesizeRequest(config=config, text="Logged."))
    with pytest.raises(grpc.aio.AioRpcError):
        bad = speech_pb2.SynthesisConfig(encoding=speech_pb2.AUDIO_ENCODING_PCM_S16LE, voice="nobody-here")
        await stack.stub.Synthesize(speech_pb2.SynthesizeRequest(config=bad, text="Refused."))
    (ok, refused) = _lines(caplog)
    rid, api, model, voice, outcome, ttfa, duration, audio = ok
    assert re.fullmatch(r"[0-9a-f]{32}", rid) and rid == stack.codec.opens[-1].request_id
    assert (api, model, voice, outcome) == ("grpc_synthesize", "qwen3-tts-tiny", "ryan", "ok")
    assert float(ttfa) > 0 and float(duration) >= float(ttfa) and float(audio) > 0
    assert refused[0] == "-" and refused[4] != "ok" and refused[5] == "-"  # refused before it had an id
