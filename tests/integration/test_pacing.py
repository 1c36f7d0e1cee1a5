"""The talker paced under load, through real processes (``voxstage serve`` with the ``pace_*`` keys): with
load from one request on, streamed requests are held once ahead of real time (the talker's /metrics counts
the held steps) and every request still gets all its audio (services/talker/pacing.py; the engine's own
tests, the step interval and whole clips among them: tests/unit/talker/test_talker_pacing.py)."""

from __future__ import annotations

import asyncio
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from tests.integration.deploykit import free_port
from tests.integration.servekit import Served, serve_stack
from voxstage.v1 import speech_pb2, speech_pb2_grpc

ROOT = Path(__file__).resolve().parents[2]
FRAMES = 12  # max_tokens: 0.96 s of audio a request
PCM = speech_pb2.AUDIO_ENCODING_PCM_S16LE
pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def paced(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Served, int]]:
    port = free_port()
    # Streams held as soon as they run ahead of real time at all: the tiny CPU model generates faster
    # than real time (RTF about 0.6 here), so the hold acts without depending on how fast a step is.
    sets = [f"stages.0.default_sampling_params.max_tokens={FRAMES}", "stages.0.pace_ahead_s=0.001",
            "stages.0.pace_from_streams=1"]  # fmt: skip
    for served in serve_stack(
        tmp_path_factory, "paced", ROOT / "deploy" / "qwen3_tts.yaml", "qwen3-tts-tiny", sets,
        args=["--talker-metrics-port", str(port)],
    ):  # fmt: skip
        yield served, port


def paced_steps(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    out = {"interval": 0.0, "ahead": 0.0}
    for line in text.splitlines():
        for by in out:
            if line.startswith(f'voxstage_talker_paced_steps_total{{by="{by}"}}'):
                out[by] = float(line.rsplit(" ", 1)[1])
    return out


async def speak(addr: str, text: str, streamed: bool) -> int:
    """Audio bytes of one request, streamed (StreamingSynthesize) or unary (Synthesize)."""
    config = speech_pb2.SynthesisConfig(encoding=PCM)
    async with grpc.aio.insecure_channel(addr) as channel:
        stub = speech_pb2_grpc.SpeechStub(channel)
        if not streamed:
            reply = await stub.Synthesize(speech_pb2.SynthesizeRequest(config=config, text=text))
            return len(reply.audio)
        S = speech_pb2.StreamingSynthesizeRequest
        audio = 0
        async for reply in stub.StreamingSynthesize(iter([S(config=config), S(text=text)])):
            if reply.WhichOneof("response") == "audio":
                audio += len(reply.audio.data)
        return audio


def test_streams_are_paced_and_every_request_gets_its_audio(paced: tuple[Served, int]) -> None:
    served, port = paced
    before = paced_steps(port)

    async def main() -> list[int]:
        texts = [f"paced request number {i}" for i in range(3)]
        jobs = [speak(served.grpc_addr, t, streamed=i < 2) for i, t in enumerate(texts)]
        return await asyncio.gather(*jobs)

    sizes = asyncio.run(main())
    samples = FRAMES * 1920  # every request runs to max_tokens: a random model rarely stops earlier
    assert all(0 < n <= 2 * samples for n in sizes), sizes
    after = paced_steps(port)
    # The streamed requests ran ahead of real time and were held (the step interval is off here).
    assert after["ahead"] > before["ahead"] and after["interval"] == before["interval"] == 0, (before, after)
