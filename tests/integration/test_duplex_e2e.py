"""Full-duplex sessions end to end on CPU (issue 12, acceptance 1 and 2): ``voxstage serve
deploy/personaplex.yaml --model personaplex-tiny`` as real processes, two sessions over the WebSocket with the
official ``openai`` client and two over gRPC ``Converse`` with the SDK, all at once, each streaming 10 s of
user audio in real time."""

from __future__ import annotations

import asyncio
import base64
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.integration import tcpkit
from tests.integration.servekit import Served
from tests.integration.stagekit import ROOT

pytestmark = pytest.mark.timeout(240)
MODEL = "personaplex-tiny"
RATE = 24_000
FRAME = 1920
SECONDS = 10.0


@dataclass
class Stack:
    grpc: str
    http: str
    proc: subprocess.Popen[bytes]
    log: Path


@pytest.fixture(scope="module")
def stack(personaplex_served: Served) -> Stack:
    # The session's PersonaPlex stack (tests/integration/conftest.py: 4 sessions, a 2 s idle timeout),
    # shared with test_chaos.
    s = personaplex_served
    return Stack(s.grpc_addr, s.http_addr, s.proc, s.log)


def user_audio(seconds: float, seed: int) -> bytes:
    t = np.arange(int(seconds * RATE)) / RATE
    x = 0.1 * np.sin(2 * np.pi * (150 + 20 * seed) * t) + 0.01 * np.random.default_rng(seed).standard_normal(
        t.size
    )
    return (x * 32767).astype("<i2").tobytes()


@dataclass
class Record:
    audio: list[tuple[float, int]] = field(default_factory=list)  # (arrival, bytes)
    transcript: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def frames(self) -> int:
        return sum(n for _, n in self.audio) // (2 * FRAME)

    def max_gap(self, since: float = 0.0, until: float = float("inf")) -> float:
        times = [t for t, _ in self.audio if since <= t <= until]
        return max(np.diff(times), default=0.0)


async def paced(send: Any, audio: bytes, seconds: float) -> None:
    """One 80 ms frame every 80 ms on an absolute schedule, as a microphone delivers it."""
    t0 = time.perf_counter()
    for k in range(int(seconds / 0.08)):
        await asyncio.sleep(max(0.0, t0 + 0.08 * k - time.perf_counter()))
        await send(audio[2 * FRAME * k : 2 * FRAME * (k + 1)])


async def websocket_session(stack: Stack, seed: int, seconds: float) -> Record:
    from openai import AsyncOpenAI

    rec = Record()
    client = AsyncOpenAI(base_url=f"http://{stack.http}/v1", api_key="unused")
    async with client.realtime.connect(model=MODEL) as conn:
        await conn.session.update(session={"type": "realtime", "instructions": f"You are agent {seed}."})

        async def send(chunk: bytes) -> None:
            await conn.input_audio_buffer.append(audio=base64.b64encode(chunk).decode())

        sender = asyncio.create_task(paced(send, user_audio(seconds, seed), seconds))
        async with asyncio.timeout(seconds + 15):
            async for event in conn:
                if event.type == "response.output_audio.delta":
                    rec.audio.append((time.perf_counter(), len(base64.b64decode(event.delta))))
                elif event.type == "response.output_audio_transcript.delta":
                    rec.transcript.append(event.delta)
                elif event.type == "error":
                    rec.errors.append(event.error.message)
                if sender.done() and rec.frames() >= int(seconds / 0.08) - 2:
                    break
        await sender
    return rec


async def converse_session(stack: Stack, seed: int, seconds: float) -> Record:
    from voxstage.client import AgentAudio, AgentTranscript, AsyncSpeechClient

    rec = Record()
    async with AsyncSpeechClient(stack.grpc) as client:
        async with client.converse(instructions=f"You are agent {seed}.", seed=seed) as session:
            sender = asyncio.create_task(paced(session.send_audio, user_audio(seconds, seed), seconds))

            async def receive() -> None:
                async for event in session:
                    if isinstance(event, AgentAudio):
                        rec.audio.append((time.perf_counter(), len(event.data)))
                    elif isinstance(event, AgentTranscript):
                        rec.transcript.append(event.text)

            reader = asyncio.create_task(receive())
            await sender
            await asyncio.sleep(0.5)
            await session.close()
            await asyncio.wait_for(reader, 15)
    return rec


def test_websocket_and_grpc_sessions_run_at_once_in_real_time(stack: Stack) -> None:
    """Two openai-client WebSocket sessions and two SDK Converse sessions at once; one WebSocket session
    leaves after 4 s and the others keep their 80 ms cadence."""

    async def main() -> tuple[list[Record], float]:
        tasks = [
            websocket_session(stack, 1, SECONDS),
            websocket_session(stack, 2, 4.0),
            converse_session(stack, 3, SECONDS),
            converse_session(stack, 4, SECONDS),
        ]
        t_leave = time.perf_counter() + 4.0
        return list(await asyncio.gather(*tasks)), t_leave

    records, t_leave = asyncio.run(main())
    for i, (rec, seconds) in enumerate(zip(records, (SECONDS, 4.0, SECONDS, SECONDS), strict=True)):
        expected = int(seconds / 0.08)
        assert not rec.errors, (i, rec.errors)
        assert rec.frames() >= expected - 3, (i, rec.frames(), expected)  # one agent frame per user frame
        assert "".join(rec.transcript), i  # the agent's text stream arrives as transcript deltas
    for i in (0, 2, 3):
        # Around the moment session 1 left, the others' agent audio kept arriving at the tick rate.
        assert records[i].max_gap(t_leave - 1.0, t_leave + 2.0) < 0.5, (i, records[i].max_gap())


def test_capacity_bad_input_and_a_vanished_client(stack: Stack) -> None:
    """Beyond max_sessions the next session is refused; a frame that is not JSON gets an error event and the
    session goes on; a client that vanishes frees its slot within one tick plus the idle timeout."""
    import websockets

    url = f"ws://{stack.http}/v1/realtime?model={MODEL}"

    async def main() -> None:
        held = [await websockets.connect(url) for _ in range(4)]
        for ws in held:
            assert '"session.created"' in await asyncio.wait_for(ws.recv(), 5)
            await ws.send('{"type": "input_audio_buffer.append", "audio": "' + "A" * 5120 + '"}')
        fifth = await websockets.connect(url)
        refusal = await asyncio.wait_for(fifth.recv(), 5)
        assert '"error"' in refusal and "session" in refusal, refusal
        await fifth.close()
        await held[0].send("not json")
        reply = await asyncio.wait_for(held[0].recv(), 5)
        while '"error"' not in reply:
            reply = await asyncio.wait_for(held[0].recv(), 5)
        assert "invalid_json" in reply, reply
        held[1].transport.abort()  # vanishes: no close frame
        await asyncio.sleep(3.5)  # idle timeout (2 s) plus a tick and some slack for a loaded CI machine
        again = await websockets.connect(url)
        assert '"session.created"' in await asyncio.wait_for(again.recv(), 5)
        for ws in (again, held[0], held[2], held[3]):
            await ws.close()

    asyncio.run(main())


def test_the_readme_talk_example(stack: Stack, tmp_path: Path) -> None:
    """The README's `voxstage talk` line as written (issue 29: it named an input file nobody had), against
    this PersonaPlex stack instead of the default port."""
    import re
    import wave

    text = (ROOT / "README.md").read_text()
    (line,) = [ln for ln in text.splitlines() if ln.startswith(".venv/bin/voxstage talk ")]
    assert "--tone" in line and "--addr localhost:50051" in line
    (tmp_path / ".venv").symlink_to(ROOT / ".venv")
    out = re.search(r"-o (\S+)", line).group(1)  # type: ignore[union-attr]
    command = line.replace("localhost:50051", stack.grpc)
    done = subprocess.run(["bash", "-c", command], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "s of agent audio for 5.00 s of input" in done.stderr, done.stderr
    with wave.open(str(tmp_path / out)) as w:
        assert w.getframerate() == RATE and w.getnframes() >= 4 * RATE  # the agent spoke alongside


def test_a_realtime_websocket_has_tcp_nodelay(stack: Stack) -> None:
    """Issue 29: the gateway's accepted WebSocket connections run with TCP_NODELAY (Nagle delayed audio)."""
    from websockets.sync.client import connect

    port = int(stack.http.rsplit(":", 1)[1])
    listener = next(c for c in tcpkit.connections() if c.local_port == port and c.state == tcpkit.LISTEN)
    (gateway,) = tcpkit.pids_holding(listener.inode)  # the gateway process under `voxstage serve`
    with connect(f"ws://{stack.http}/v1/realtime?model={MODEL}", open_timeout=10) as ws:
        assert '"session.created"' in str(ws.recv(timeout=10))
        assert tcpkit.accepted_nodelay(gateway, port, ws.socket.getsockname()[1]) == ""


def test_a_voice_recording_instead_of_a_stored_voice(stack: Stack) -> None:
    """``voice_audio`` (a WAV file's bytes) goes to the codec, which encodes it for the talker's voice prompt;
    a recording and a stored voice together are refused, naming the field."""
    import io

    import soundfile as sf

    from voxstage.client import AgentAudio, AsyncSpeechClient, SpeechError

    buf = io.BytesIO()
    t = np.arange(16_000 * 2) / 16_000
    sf.write(buf, (0.2 * np.sin(2 * np.pi * 180 * t)).astype(np.float32), 16_000, format="WAV")

    async def main() -> int:
        received = 0
        async with AsyncSpeechClient(stack.grpc) as client:
            with pytest.raises(SpeechError, match="voice_audio"):
                async with client.converse(voice="NATF0", voice_audio=buf.getvalue()):
                    pass
            async with client.converse(voice_audio=buf.getvalue()) as session:
                sender = asyncio.create_task(paced(session.send_audio, user_audio(2.0, 9), 2.0))
                async for event in session:
                    if isinstance(event, AgentAudio):
                        received += len(event.data) // (2 * FRAME)
                    if sender.done() and received >= 20:
                        break
                await sender
        return received

    assert asyncio.run(main()) >= 20
