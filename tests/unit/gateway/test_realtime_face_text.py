"""The ``/v1/realtime`` face's per-frame text (issue 27): the delta events it builds around their payload are
the text ``json.dumps`` wrote for them, and a connection read in 64 KiB parts still takes events of any size
up to the limit."""

from __future__ import annotations

import base64
import json
import os
from typing import Any

import pytest
from duplex_fakes import FakeDuplexCodec
from gateway_kit import MakeStack
from hypothesis import given, settings
from hypothesis import strategies as st
from test_duplex_realtime import next_json, raw_session, tone

from gateway.realtime.events import DeltaText, audio_delta
from gateway.realtime.ws import READ_CHUNK_BYTES
from voxstage.duplex_audio import FRAME_SAMPLES, MAX_EVENT_BYTES

AUDIO = "response.output_audio.delta"
TRANSCRIPT = "response.output_audio_transcript.delta"
IDS = ("resp_0123456789abcdef0123", "item_fedcba9876543210fedc")


def dumped(kind: str, ids: tuple[str, str], delta: str, event_id: str) -> str:
    """What the face sent before DeltaText: the event dict, its event_id added last, through json.dumps."""
    event: dict[str, Any] = audio_delta(kind, ids, delta)
    event["event_id"] = event_id
    return json.dumps(event)


@pytest.mark.parametrize("size", [0, 1, 2, 3, 4, 3839, 3840, 3841])
def test_audio_delta_text_is_json_dumps_of_the_event(size: int) -> None:
    data = os.urandom(size)
    text = DeltaText(AUDIO, IDS).base64(data, "event_abc_7")
    assert text == dumped(AUDIO, IDS, base64.b64encode(data).decode("ascii"), "event_abc_7")
    assert base64.b64decode(json.loads(text)["delta"]) == data


TRICKY = [
    "",
    "plain words ",
    'a "quoted" word',
    "back\\slash and /slash/",
    "".join(map(chr, range(32))) + "\x7f",  # every control character, and DEL
    "é ñ ü ß",
    "日本語のテキスト",
    "emoji 🎙️👋🏽 beyond the BMP",
    "\ud800 lone surrogates \udfff",
    "\u2028 line and paragraph separators \u2029",
    "</script><!--",
    "\ufeff byte order mark",
]


@pytest.mark.parametrize("delta", TRICKY)
def test_transcript_delta_text_escapes_as_json_dumps(delta: str) -> None:
    deltas = DeltaText(TRANSCRIPT, IDS)
    assert deltas.text(delta, "event_abc_8") == dumped(TRANSCRIPT, IDS, delta, "event_abc_8")


@settings(max_examples=200, deadline=None)
@given(delta=st.text(), event_id=st.text(), response_id=st.text(max_size=30), item_id=st.text(max_size=30))
def test_any_text_and_ids_give_the_same_json(
    delta: str, event_id: str, response_id: str, item_id: str
) -> None:
    ids = (response_id, item_id)
    assert DeltaText(TRANSCRIPT, ids).text(delta, event_id) == dumped(TRANSCRIPT, ids, delta, event_id)


async def test_connections_are_read_in_parts_and_large_events_still_arrive(
    make_duplex_stack: MakeStack,
) -> None:
    stack = await make_duplex_stack()
    codec: FakeDuplexCodec = stack.codec  # type: ignore[assignment]
    ws = await raw_session(stack)
    try:
        assert (await next_json(ws))["type"] == "session.created"
        http = stack.gateway.http
        assert http is not None
        sockets = [c for c in http.server_state.connections if "websockets" in type(c).__module__]
        assert sockets and all(c.transport.max_size == READ_CHUNK_BYTES for c in sockets)
        # 1.9 s of audio (within the 2 s input buffer): an event of 122 KB, more than one read.
        audio = tone(1.9).tobytes()
        event = json.dumps({"type": "input_audio_buffer.append", "audio": base64.b64encode(audio).decode()})
        assert READ_CHUNK_BYTES < len(event) < MAX_EVENT_BYTES
        await ws.send(event)
        frames = len(audio) // 2 // FRAME_SAMPLES
        # The codec double answers every frame: all of them were decoded, and every answer comes back.
        answers = [await next_json(ws, AUDIO) for _ in range(frames)]
        assert codec.user_messages == frames
        assert [len(base64.b64decode(a["delta"])) for a in answers] == [2 * FRAME_SAMPLES] * frames
    finally:
        await ws.close()
