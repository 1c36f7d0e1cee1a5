"""Fixtures: a gateway in this event loop in front of stage doubles (``fakes.py``)."""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

sys.path.insert(0, str(Path(__file__).parent))

from fakes import MODEL, FakeCodec, FakeTalker, StageDouble, start_codec, start_talker  # noqa: E402

from voxstage.config import load_deploy_config  # noqa: E402
from voxstage.gateway.app import GatewayServer  # noqa: E402
from voxstage.v1 import speech_pb2_grpc  # noqa: E402

REPO = Path(__file__).resolve().parents[3]
SEED = REPO / "deploy" / "qwen3_tts.yaml"
SPEAKERS = ["serena", "vivian", "ryan", "eric"]
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


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "cache"
    monkeypatch.setenv("VOXSTAGE_CACHE", str(root))
    write_checkpoint_config(root / "presets" / MODEL)
    return root


@pytest.fixture
async def make_stack(cache: Path) -> AsyncIterator[MakeStack]:
    stacks: list[Stack] = []
    extra: list[StageDouble] = []

    async def make(
        *codecs: FakeCodec,
        talker: FakeTalker | None = None,
        talkers: int = 1,
        overrides: Sequence[str] = (),
        probe_s: float = 0.2,
    ) -> Stack:
        doubles = [await start_codec(c) for c in (codecs or (FakeCodec(),))]
        talker_doubles = [await start_talker(talker if i == 0 else None) for i in range(talkers)]
        extra.extend([*doubles, *talker_doubles])
        config = load_deploy_config(SEED, platform="cpu", overrides=list(overrides))
        gw = GatewayServer(
            config,
            [d.address for d in doubles],
            [t.address for t in talker_doubles],
            host="127.0.0.1",
            grpc_port=0,
            http_port=0,
            grace_s=1.0,
        )
        gw.core.probe_interval_s = probe_s
        await gw.start()
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{gw.grpc_port}")
        stack = Stack(gw, doubles, talker_doubles, channel)
        stacks.append(stack)
        return stack

    yield make
    for stack in stacks:
        await stack.channel.close()
        await stack.gateway.stop()
    # Doubles a test started itself (a revived replica) are stopped too, inside this loop.
    doubles = {id(d): d for d in [*extra, *(d for st in stacks for d in [*st.codecs, *st.talkers])]}
    for double in doubles.values():
        await double.server.stop(0)
