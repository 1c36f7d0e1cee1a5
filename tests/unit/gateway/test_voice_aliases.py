"""OpenAI's voice names resolve to the model's voices on HTTP and gRPC alike (``gateway/voice_aliases.py``),
the deploy file can replace the table, docs/api.md lists the defaults; and ``instructions`` reach the model
that takes them and are refused, naming the field, by one that does not."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import grpc
import httpx
import pytest
from gateway_fakes import FakeTalker
from gateway_kit import REPO, MakeStack, catalog

from gateway.voice_aliases import DEFAULT_ALIASES, OPENAI_VOICES
from voxstage.v1 import speech_pb2

PCM = speech_pb2.AUDIO_ENCODING_PCM_S16LE


def test_the_default_table_covers_openais_names_and_the_doc_lists_it() -> None:
    import typing

    from openai.types.audio.speech_create_params import Voice

    names = next(typing.get_args(arm) for arm in typing.get_args(Voice) if typing.get_origin(arm) is Literal)
    assert sorted(names) == sorted(OPENAI_VOICES)  # the installed client's list
    for family, table in DEFAULT_ALIASES.items():
        assert sorted(table) == sorted(OPENAI_VOICES), family
    doc = (REPO / "docs" / "api.md").read_text().split("\n## Voice aliases\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in doc.splitlines() if line.startswith("| `")]
    assert rows == [
        f"| `{a}` | `{DEFAULT_ALIASES['qwen3_tts'][a]}` | `{DEFAULT_ALIASES['personaplex'][a]}` | "
        f"`{DEFAULT_ALIASES['audio8_tts'][a]}` |"
        for a in OPENAI_VOICES
    ]


async def test_an_alias_works_on_http_and_grpc(make_stack: MakeStack) -> None:
    stack = await make_stack()  # the built-in table: every target is a voice of the kit's checkpoint
    async with httpx.AsyncClient(base_url=stack.http_url) as http:
        r = await http.post("/v1/audio/speech", json={"input": "hi", "voice": "alloy", "stream": False})
        assert r.status_code == 200, r.text
        assert stack.codec.opens[-1].voice == "serena"
        r = await http.post("/v1/audio/speech", json={"input": "hi", "voice": "nobody"})
        assert r.status_code == 404 and "voice 'nobody' does not exist" in r.json()["error"]["message"]
    config = speech_pb2.SynthesisConfig(encoding=PCM, voice="Nova")
    await stack.stub.Synthesize(speech_pb2.SynthesizeRequest(config=config, text="hi"))
    assert stack.codec.opens[-1].voice == "vivian"


async def test_an_alias_of_a_missing_voice_is_refused_naming_it(make_stack: MakeStack) -> None:
    stack = await make_stack(overrides=["gateway.voice_aliases={onyx: ghost, verse: ghost}"])
    async with httpx.AsyncClient(base_url=stack.http_url) as http:
        r = await http.post("/v1/audio/speech", json={"input": "hi", "voice": "onyx"})
        error = r.json()["error"]
        assert r.status_code == 404 and error["param"] == "voice" and error["code"] == "voice_not_found"
        assert "'onyx' is an alias (gateway.voice_aliases) of 'ghost'" in error["message"]
    with pytest.raises(grpc.aio.AioRpcError) as err:
        config = speech_pb2.SynthesisConfig(encoding=PCM, voice="verse")
        await stack.stub.Synthesize(speech_pb2.SynthesizeRequest(config=config, text="hi"))
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    assert (err.value.details() or "").startswith("config.voice: voice 'verse' is an alias")


async def test_the_deploy_file_replaces_the_table(make_stack: MakeStack) -> None:
    stack = await make_stack(overrides=["gateway.voice_aliases={narrator: eric, alloy: ryan}"])
    config = speech_pb2.SynthesisConfig(encoding=PCM, voice="narrator")
    await stack.stub.Synthesize(speech_pb2.SynthesizeRequest(config=config, text="hi"))
    assert stack.codec.opens[-1].voice == "eric"
    config = speech_pb2.SynthesisConfig(encoding=PCM, voice="alloy")
    await stack.stub.Synthesize(speech_pb2.SynthesizeRequest(config=config, text="hi"))
    assert stack.codec.opens[-1].voice == "ryan"
    with pytest.raises(grpc.aio.AioRpcError) as err:  # the built-in table no longer applies
        config = speech_pb2.SynthesisConfig(encoding=PCM, voice="nova")
        await stack.stub.Synthesize(speech_pb2.SynthesizeRequest(config=config, text="hi"))
    assert "voice 'nova' does not exist" in (err.value.details() or "")


async def test_instructions_reach_a_model_that_takes_them(make_stack: MakeStack) -> None:
    stack = await make_stack()
    async with httpx.AsyncClient(base_url=stack.http_url) as http:
        body = {"input": "hi", "instructions": "Whisper.", "stream": False}
        r = await http.post("/v1/audio/speech", json=body)
        assert r.status_code == 200, r.text
    assert stack.codec.opens[-1].instructions == "Whisper."


async def test_instructions_are_refused_by_a_model_that_does_not_take_them(
    make_stack: MakeStack, cache: Path
) -> None:
    stack = await make_stack(talker=FakeTalker(catalog=catalog("base")))
    async with httpx.AsyncClient(base_url=stack.http_url) as http:
        body = {"input": "hi", "instructions": "Whisper.", "ref_audio": "AAAA"}
        r = await http.post("/v1/audio/speech", json=body)
    error = r.json()["error"]
    assert r.status_code == 400 and error["param"] == "instructions"
    assert error["code"] == "instructions_not_supported" and not stack.codec.opens
