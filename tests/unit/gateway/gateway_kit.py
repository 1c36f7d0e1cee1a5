"""Shared pieces of the gateway tests: the stack a test drives and the checkpoint config the catalog reads."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import grpc
from gateway_fakes import FakeCodec, StageDouble

from gateway.app import GatewayServer
from voxstage.v1 import speech_pb2_grpc

REPO = Path(__file__).resolve().parents[3]
SEED = REPO / "deploy" / "qwen3_tts.yaml"
DUPLEX_SEED = REPO / "deploy" / "personaplex.yaml"
# The Qwen3-TTS built-in voice-alias table (gateway/voice_aliases.py) also names aiden and uncle_fu.
SPEAKERS = ["serena", "vivian", "ryan", "eric", "aiden", "uncle_fu"]
LANGUAGES = {"english": 2050, "chinese": 2055, "german": 2053, "sichuan_dialect": 2062}


def write_checkpoint_config(directory: Path, variant: str = "custom_voice") -> None:
    """The voice-bearing part of a Qwen3-TTS ``config.json``, as the gateway's catalog reads it."""
    talker = {"codec_language_id": LANGUAGES}
    if variant == "custom_voice":
        talker["spk_id"] = {name: 3000 + i for i, name in enumerate(SPEAKERS)}
        talker["spk_is_dialect"] = {"eric": "sichuan_dialect"}
    directory.mkdir(parents=True, exist_ok=True)
    data = {"model_type": "qwen3_tts", "tts_model_type": variant, "talker_config": talker}
    (directory / "config.json").write_text(json.dumps(data))


@dataclass
class Stack:
    gateway: GatewayServer
    codecs: list[StageDouble]
    talkers: list[StageDouble]
    channel: grpc.aio.Channel

    @property
    def talker(self) -> StageDouble:
        return self.talkers[0]

    @property
    def codec(self) -> FakeCodec:
        return self.codecs[0].servicer

    @property
    def stub(self) -> speech_pb2_grpc.SpeechStub:
        return speech_pb2_grpc.SpeechStub(self.channel)

    @property
    def grpc_addr(self) -> str:
        return f"127.0.0.1:{self.gateway.grpc_port}"

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.gateway.http_port}"


MakeStack = Callable[..., Awaitable[Stack]]


async def until(condition: Callable[[], bool], limit_s: float = 5.0) -> None:
    """Poll ``condition``: cleanup (a freed slot, a cancelled stream) has no event a test could wait on."""
    deadline = time.monotonic() + limit_s
    while not condition():
        assert time.monotonic() < deadline, f"condition not reached in time: {condition.__doc__ or ''}"
        await asyncio.sleep(0.01)
