"""The open says whether the client hears the audio only at the end (``StreamOpen.whole_clip``): unary
``Synthesize`` and HTTP speech without streaming do, ``StreamingSynthesize`` and streamed HTTP do not. The
talker never holds a whole clip for being ahead of real time (tests/unit/talker/test_talker_pacing.py)."""

from __future__ import annotations

import httpx
from gateway_fakes import expected_samples
from gateway_kit import MakeStack

from voxstage.v1 import speech_pb2

PCM = speech_pb2.AUDIO_ENCODING_PCM_S16LE
TEXT = "whole or streamed"


async def test_unary_and_plain_http_are_whole_clips_streams_are_not(make_stack: MakeStack) -> None:
    stack = await make_stack()
    config = speech_pb2.SynthesisConfig(encoding=PCM)
    reply = await stack.stub.Synthesize(speech_pb2.SynthesizeRequest(config=config, text=TEXT))
    assert len(reply.audio) == 2 * expected_samples(TEXT)
    S = speech_pb2.StreamingSynthesizeRequest
    async for _ in stack.stub.StreamingSynthesize(iter([S(config=config), S(text=TEXT)])):
        pass
    async with httpx.AsyncClient(base_url=stack.http_url) as http:
        for stream in (False, True):
            body = {"input": TEXT, "voice": "ryan", "response_format": "wav", "stream": stream}
            r = await http.post("/v1/audio/speech", json=body)
            assert r.status_code == 200, r.text
    assert [op.whole_clip for op in stack.codec.opens] == [True, False, True, False]
