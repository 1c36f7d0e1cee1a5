"""Duplex sessions through the SDK (async and sync) and ``voxstage talk``, against a duplex codec double."""

from __future__ import annotations

import asyncio
import time
import wave
from pathlib import Path

import grpc
import numpy as np
import pytest
import soundfile as sf
from duplex_fakes import FakeDuplexCodec
from gateway_kit import MakeStack

from voxstage.client import (
    AgentAudio,
    AgentTranscript,
    AsyncSpeechClient,
    ResponseDone,
    RetryPolicy,
    SpeechClient,
    SpeechError,
)
from voxstage.launch.cli import main

FRAME_BYTES = 1920 * 2


def tone(seconds: float) -> bytes:
    t = np.arange(int(seconds * 24_000)) / 24_000
    return (0.3 * np.sin(2 * np.pi * 220 * t) * 32767).astype("<i2").tobytes()


async def test_async_session(make_duplex_stack: MakeStack) -> None:
    stack = await make_duplex_stack()
    codec: FakeDuplexCodec = stack.codec  # type: ignore[assignment]
    async with (
        AsyncSpeechClient(stack.grpc_addr) as client,
        client.converse(voice="NATF2", instructions="You are kind.", seed=5, top_k=100) as session,
    ):
        assert (
            session.info is not None and session.info.voice == "NATF2" and session.info.sample_rate == 24_000
        )
        data = tone(0.8)

        async def talk() -> None:
            t0 = time.monotonic()
            for i, off in enumerate(range(0, len(data), FRAME_BYTES)):
                await asyncio.sleep(max(t0 + i * 0.08 - time.monotonic(), 0))
                await session.send_audio(data[off : off + FRAME_BYTES])
            await session.close()

        sender = asyncio.create_task(talk())
        events = [e async for e in session]
        await sender
    audio = b"".join(e.data for e in events if isinstance(e, AgentAudio))
    text = "".join(e.text for e in events if isinstance(e, AgentTranscript))
    assert len(audio) == len(data) and text == "".join(f"w{i} " for i in range(10))
    assert isinstance(events[-1], ResponseDone) and events[-1].status == "completed"
    op = codec.opens[-1]
    assert (op.voice, op.instructions, op.seed, op.sampling.top_k) == ("NATF2", "You are kind.", 5, 100)


async def test_sync_session_in_a_thread_and_refusals(make_duplex_stack: MakeStack) -> None:
    stack = await make_duplex_stack(overrides=["duplex_session.max_sessions=1"])

    def run() -> list[object]:
        with SpeechClient(stack.grpc_addr) as client, client.converse(output_format="pcmu") as session:
            assert session.info is not None and session.info.output_format == "pcmu"
            session.send_audio(tone(0.4))
            session.close()
            return list(session)

    events = await asyncio.to_thread(run)
    audio = b"".join(e.data for e in events if isinstance(e, AgentAudio))
    assert len(audio) == 5 * 640 and isinstance(events[-1], ResponseDone)

    async with AsyncSpeechClient(stack.grpc_addr, retry=RetryPolicy(max_attempts=1)) as client:
        with pytest.raises(SpeechError) as err:
            async with client.converse(temperature=-1.0):
                pass
        assert err.value.code is grpc.StatusCode.INVALID_ARGUMENT and "temperature" in err.value.message
        with pytest.raises(ValueError, match="output_format"):
            client.converse(output_format="opus")
        async with client.converse() as held:
            with pytest.raises(SpeechError) as err:
                async with client.converse():
                    pass
            assert err.value.code is grpc.StatusCode.RESOURCE_EXHAUSTED
            assert held.info is not None


async def test_talk_cli(
    make_duplex_stack: MakeStack, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    stack = await make_duplex_stack()
    rate = 16_000  # any input rate: the CLI resamples to 24 kHz
    t = np.arange(int(0.8 * rate)) / rate
    sf.write(tmp_path / "in.wav", (0.3 * np.sin(2 * np.pi * 200 * t)).astype(np.float32), rate)
    out, transcript = tmp_path / "out.wav", tmp_path / "agent.txt"
    argv = ["talk", str(tmp_path / "in.wav"), "-o", str(out), "--addr", stack.grpc_addr]
    argv += ["--voice", "NATM0", "--instructions", "Be brief.", "--transcript", str(transcript)]
    start = time.monotonic()
    assert await asyncio.to_thread(main, argv) == 0
    assert time.monotonic() - start >= 0.7  # streamed in real time, not all at once
    with wave.open(str(out)) as w:
        assert w.getframerate() == 24_000 and w.getnframes() == 10 * 1920
    assert transcript.read_text() == "".join(f"w{i} " for i in range(10))
    codec: FakeDuplexCodec = stack.codec  # type: ignore[assignment]
    assert codec.opens[-1].voice == "NATM0" and codec.opens[-1].instructions == "Be brief."
    capsys.readouterr()
    assert await asyncio.to_thread(main, ["talk", str(tmp_path / "missing.wav"), "-o", str(out)]) == 2
    assert f"{tmp_path / 'missing.wav'}: no such file" in capsys.readouterr().err  # not libsndfile's words
    # The README's first try: a tone instead of a recording, streamed in real time all the same.
    start = time.monotonic()
    argv = ["talk", "--tone", "0.8", "-o", str(out), "--addr", stack.grpc_addr]
    assert await asyncio.to_thread(main, argv) == 0
    assert time.monotonic() - start >= 0.7
    with wave.open(str(out)) as w:
        assert w.getnframes() == 10 * 1920
