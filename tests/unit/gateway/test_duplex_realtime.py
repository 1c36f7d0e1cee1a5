"""``/v1/realtime`` with the official ``openai`` client against a duplex codec double: concurrent sessions,
formats, the one long-running response, bad input, admission and cleanup."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from typing import Any

import numpy as np
import pytest
import websockets
from duplex_fakes import FakeDuplexCodec
from gateway_kit import MakeStack, Stack
from gateway_kit import until as wait_until
from openai import AsyncOpenAI

from voxstage import g711
from voxstage.duplex_audio import FRAME_SAMPLES, MAX_EVENT_BYTES

FRAME_BYTES = FRAME_SAMPLES * 2  # 80 ms of 24 kHz pcm16


def tone(seconds: float, rate: int = 24_000) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    return (0.3 * np.sin(2 * np.pi * 220 * t) * 32767).astype("<i2")


def client(stack: Stack) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=f"{stack.http_url}/v1", api_key="x")


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


async def until(conn: Any, kind: str, within: float = 5.0) -> Any:
    async with asyncio.timeout(within):
        async for event in conn:
            if event.type == kind:
                return event
    raise AssertionError(f"connection closed before {kind}")


async def test_two_sessions_stream_in_real_time(make_duplex_stack: MakeStack) -> None:
    stack = await make_duplex_stack()
    codec: FakeDuplexCodec = stack.codec  # type: ignore[assignment]
    seconds = 2.0
    audio = tone(seconds).tobytes()

    async def converse(persona: str, voice: str) -> dict[str, Any]:
        async with client(stack).realtime.connect(model="personaplex-tiny") as conn:
            created = await conn.recv()
            assert (
                created.type == "session.created" and created.session.audio.input.format.type == "audio/pcm"
            )
            await conn.session.update(
                session={"type": "realtime", "instructions": persona, "audio": {"output": {"voice": voice}}}
            )
            updated = await until(conn, "session.updated")
            assert updated.session.instructions == persona and updated.session.audio.output.voice == voice
            arrivals: list[float] = []
            text: list[str] = []
            kinds: list[str] = []

            async def send() -> None:
                t0 = time.monotonic()
                # 20 ms packets, paced in real time: the gateway merges them into 80 ms frames.
                for i, off in enumerate(range(0, len(audio), FRAME_BYTES // 4)):
                    await asyncio.sleep(max(t0 + i * 0.02 - time.monotonic(), 0))
                    await conn.input_audio_buffer.append(audio=b64(audio[off : off + FRAME_BYTES // 4]))

            sender = asyncio.create_task(send())
            frames = int(seconds / 0.08)
            async with asyncio.timeout(seconds + 3):
                async for event in conn:
                    kinds.append(event.type)
                    if event.type == "response.output_audio.delta":
                        assert len(base64.b64decode(event.delta)) == FRAME_BYTES
                        assert (event.output_index, event.content_index) == (0, 0) and event.item_id
                        arrivals.append(time.monotonic())
                    elif event.type == "response.output_audio_transcript.delta":
                        text.append(event.delta)
                    if len(arrivals) == frames and len(text) == frames:
                        break
            await sender
            return {"arrivals": arrivals, "text": text, "kinds": kinds}

    a, b = await asyncio.gather(converse("You are Ann.", "NATF0"), converse("You are Bob.", "NATM1"))
    for result in (a, b):
        assert result["kinds"][0] == "response.created"  # the one response starts with the agent's audio
        assert result["kinds"].count("response.created") == 1
        assert result["text"][:3] == ["w0 ", "w1 ", "w2 "]
        gaps = np.diff(result["arrivals"])
        # At the tick rate: 25 frames over ~2 s, none bunched up at the end.
        assert 1.6 < result["arrivals"][-1] - result["arrivals"][0] < 2.4 and np.median(gaps) > 0.05
    personas = sorted(op.instructions for op in codec.opens)
    assert personas == ["You are Ann.", "You are Bob."] and {op.voice for op in codec.opens} == {
        "NATF0",
        "NATM1",
    }
    assert codec.protocol_errors == [] and codec.user_messages == 2 * 25  # one user_audio per 80 ms frame
    await asyncio.sleep(0.2)
    assert codec.cancels == 2 and codec.active == 0 and not stack.gateway.core.sessions.live


async def test_closing_one_session_leaves_the_other_running(make_duplex_stack: MakeStack) -> None:
    stack = await make_duplex_stack()
    codec: FakeDuplexCodec = stack.codec  # type: ignore[assignment]
    async with client(stack).realtime.connect(model="personaplex-tiny") as keep:
        async with client(stack).realtime.connect(model="personaplex-tiny") as leave:
            for conn in (keep, leave):
                await conn.input_audio_buffer.append(audio=b64(tone(0.16).tobytes()))
                await until(conn, "response.output_audio.delta")
        await asyncio.sleep(0.2)
        assert codec.cancels == 1 and len(stack.gateway.core.sessions.live) == 1
        await keep.input_audio_buffer.append(audio=b64(tone(0.08).tobytes()))
        text = []
        while "w2 " not in text:  # 3 frames in, 3 agent frames out
            text.append((await until(keep, "response.output_audio_transcript.delta")).delta)
        assert text == ["w0 ", "w1 ", "w2 "]
    await asyncio.sleep(0.2)
    assert codec.active == 0


async def test_g711_in_and_out(make_duplex_stack: MakeStack) -> None:
    stack = await make_duplex_stack()
    codec: FakeDuplexCodec = stack.codec  # type: ignore[assignment]
    async with client(stack).realtime.connect(model="personaplex-tiny") as conn:
        await conn.session.update(
            session={
                "type": "realtime",
                "audio": {
                    "input": {"format": {"type": "audio/pcmu"}},
                    "output": {"format": {"type": "audio/pcma"}},
                },
                "voxstage": {"seed": 11},  # the official client passes the vendor block through
            }
        )
        updated = await until(conn, "session.updated")
        assert updated.session.audio.output.format.type == "audio/pcma"
        ulaw = g711.encode_mulaw(tone(0.5, 8000))  # 0.5 s at 8 kHz: 6 frames once resampled to 24 kHz
        await conn.input_audio_buffer.append(audio=b64(ulaw))
        got = b""
        async with asyncio.timeout(3):
            async for event in conn:
                if event.type == "response.output_audio.delta":
                    got += base64.b64decode(event.delta)
                if len(got) >= 6 * 640:
                    break
    assert codec.user_messages == 6 and len(got) == 6 * 640  # 80 ms of A-law at 8 kHz is 640 bytes
    assert codec.opens[-1].seed == 11
    pcm = g711.decode_alaw(got[-640:]).astype(np.float32) / 32768
    assert 0.15 < np.abs(pcm).max() < 0.35  # the double's 0.25 tone, through resampling and A-law


async def raw_session(stack: Stack) -> Any:
    return await websockets.connect(
        f"ws://127.0.0.1:{stack.gateway.http_port}/v1/realtime?model=personaplex-tiny"
    )


async def next_json(ws: Any, kind: str | None = None) -> dict[str, Any]:
    async with asyncio.timeout(5):
        while True:
            event = json.loads(await ws.recv())
            if kind is None or event["type"] == kind:
                return event


async def test_bad_input_gets_error_events_and_the_session_goes_on(make_duplex_stack: MakeStack) -> None:
    stack = await make_duplex_stack()
    async with client(stack).realtime.connect(model="personaplex-tiny") as other:
        await other.input_audio_buffer.append(audio=b64(tone(0.08).tobytes()))
        await until(other, "response.output_audio.delta")
        ws = await raw_session(stack)
        assert (await next_json(ws))["type"] == "session.created"

        def event(kind: str, **fields: Any) -> str:
            return json.dumps({"type": kind, **fields})

        def session(**fields: Any) -> str:
            return event("session.update", session=fields)

        def audio_in(**fields: Any) -> str:
            return session(audio={"input": fields})

        append = "input_audio_buffer.append"
        cases: list[tuple[str | bytes, str, str | None]] = [
            ("not json", "invalid_json", "event"),
            (b"\x00\x01", "invalid_event", "event"),
            (json.dumps({"no": "type"}), "invalid_event", "type"),
            (event("session.dance"), "unknown_event", "type"),
            (event("input_audio_buffer.commit"), "unsupported_event", "type"),
            (event("response.create"), "unsupported_event", "type"),
            (event("response.cancel"), "unsupported_event", "type"),
            (event("conversation.item.create", item={}), "unsupported_event", "type"),
            (event(append, audio="%%%"), "invalid_audio", "audio"),
            (event(append, audio=b64(b"\x01\x02\x03")), "invalid_audio", "audio"),
            (event(append, audio=""), "invalid_audio", "audio"),
            (event(append), "missing_field", "audio"),
            ("x" * (MAX_EVENT_BYTES + 1), "event_too_large", "event"),
            (audio_in(format={"type": "audio/opus"}),
             "unsupported_format", "session.audio.input.format.type"),
            (audio_in(format={"type": "audio/pcm", "rate": 16000}),
             "unsupported_format", "session.audio.input.format.rate"),
            (audio_in(turn_detection={"type": "server_vad"}),
             "unsupported_parameter", "session.audio.input.turn_detection"),
            (session(temperature=0.8), "unknown_parameter", "session.temperature"),
            (session(voxstage={"top_k": 0}), "invalid_value", "session.voxstage.top_k"),
            (session(model="gpt-realtime"), "model_not_found", "session.model"),
        ]  # fmt: skip
        for frame, code, param in cases:
            await ws.send(frame)
            error = await next_json(ws, "error")
            assert (error["error"]["code"], error["error"]["param"]) == (code, param), frame[:200]
            assert error["error"]["message"]
        await ws.send(json.dumps({"type": "input_audio_buffer.commit", "event_id": "c1"}))
        assert (await next_json(ws, "error"))["error"]["event_id"] == "c1"
        # Still a working session: settings, then audio, then settings are fixed.
        await ws.send(
            json.dumps({"type": "session.update", "session": {"voxstage": {"seed": 7, "top_k": 250}}})
        )
        updated = await next_json(ws, "session.updated")
        assert updated["session"]["voxstage"]["seed"] == 7 and updated["session"]["voxstage"]["top_k"] == 250
        await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": b64(tone(0.08).tobytes())}))
        assert (await next_json(ws, "response.created"))["response"]["status"] == "in_progress"
        await ws.send(json.dumps({"type": "session.update", "session": {"instructions": "late"}}))
        late = await next_json(ws, "error")
        assert late["error"]["code"] == "session_already_started" and late["error"]["param"] == "session"
        await ws.close()
        codec: FakeDuplexCodec = stack.codec  # type: ignore[assignment]
        assert codec.opens[-1].seed == 7 and codec.opens[-1].sampling.top_k == 250
        # The other session never noticed.
        await other.input_audio_buffer.append(audio=b64(tone(0.08).tobytes()))
        seen = [(await until(other, "response.output_audio_transcript.delta")).delta for _ in range(2)]
        assert seen == ["w0 ", "w1 "]


async def test_beyond_max_sessions_and_a_vanished_client_frees_its_slot(make_duplex_stack: MakeStack) -> None:
    stack = await make_duplex_stack()  # personaplex.yaml: duplex_session.max_sessions 2
    codec: FakeDuplexCodec = stack.codec  # type: ignore[assignment]
    first, second = await raw_session(stack), await raw_session(stack)
    for ws in (first, second):
        await next_json(ws, "session.created")
    await first.send(json.dumps({"type": "input_audio_buffer.append", "audio": b64(tone(0.08).tobytes())}))
    await next_json(first, "response.output_audio.delta")
    async with client(stack).realtime.connect(model="personaplex-tiny") as third:
        refused = await third.recv()
        assert refused.type == "error" and refused.error.code == "session_limit_reached"
        with pytest.raises(websockets.ConnectionClosedError) as closed:
            await third.recv()
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1013
    # The client vanishes without a close frame: its codec stream is cancelled and the slot is free.
    first.transport.abort()
    await wait_until(lambda: codec.cancels == 1 and len(stack.gateway.core.sessions.live) == 1)
    assert codec.active == 0
    fourth = await raw_session(stack)
    assert (await next_json(fourth))["type"] == "session.created"
    for ws in (second, fourth):
        await ws.close()


async def test_turn_mode_refuses_realtime(make_stack: MakeStack) -> None:
    stack = await make_stack()  # the Qwen3-TTS seed: session_mode turn
    async with client(stack).realtime.connect(model="qwen3-tts-tiny") as conn:
        event = await conn.recv()
        assert event.type == "error" and event.error.code == "session_mode_not_duplex"
        assert "session_mode: duplex" in event.error.message and event.error.param == "session_mode"
