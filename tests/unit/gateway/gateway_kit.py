"""Shared pieces of the gateway tests: the stack a test drives and the catalog a talker double reports."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import grpc
from gateway_fakes import LANGUAGES, SPEAKERS, FakeCodec, StageDouble, catalog  # noqa: F401 - tests import these from here

from gateway.app import GatewayServer
from voxstage.v1 import speech_pb2_grpc

REPO = Path(__file__).resolve().parents[3]
SEED = REPO / "deploy" / "qwen3_tts.yaml"
DUPLEX_SEED = REPO / "deploy" / "personaplex.yaml"
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
