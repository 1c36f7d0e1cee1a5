"""Realtime load generator (issue 27): N concurrent full-duplex sessions through the gateway's
``/v1/realtime`` WebSocket, each driven by the official ``openai`` client as a user's program would drive it.

Each session ``client.realtime.connect(model=...)``, takes ``session.created``, sends ``session.update``
(persona, voice), then one ``input_audio_buffer.append`` of 80 ms of 24 kHz pcm16 every 80 ms on an absolute
schedule for ``--seconds`` (the client's lateness against that schedule is kept per frame), and records every
``response.output_audio.delta`` as it arrives. After the last frame and a short grace it closes the socket.
Errors: ``error`` events by their ``code``, and a socket the server closed with anything but 1000 as
``WS_CLOSE_<code>``, or ``WS_CLOSED_EARLY`` when it closed normally before the user was done.

The level loop, the playback as heard and the row are ``bench/duplex_levels.py``'s (shared with gRPC
``Converse``'s ``bench/duplex_loadgen.py``): late frames, stalls and the worst stall, first agent audio,
response latency, tick p50/p95/p99 per stage, per-process CPU and GPU busy.

    python -m bench.realtime_loadgen --out rt.json --device cuda --levels 32,64 \
        --seconds 60 --client-procs 4 --set stages.0.gpu_memory_utilization=0.86 \
        --set stages.1.gpu_memory_utilization=0.1 --set stages.1.enforce_eager=false
    python -m bench.realtime_loadgen --out smoke.json --model TINY_PRESET --device cpu --levels 2 \
        --seconds 3

The model and deploy file default to the duplex family's (``voxstage.families``): its size-true preset and
its seed deploy file.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import json
import time
import weakref
from typing import Any, cast

import anyio
from openai import AsyncOpenAI
from openai._utils import async_maybe_transform
from openai.resources.realtime.realtime import AsyncRealtimeConnection, ResponseCreateEventWithReferencesParam
from openai.types.realtime import RealtimeClientEventParam
from websockets.exceptions import ConnectionClosed

from bench.duplex_levels import (
    SessionOptions,
    SessionRecord,
    paced,
    run_cli,
    user_frames_b64,
)

CLOSE_NORMAL = 1000
SESSION_SLACK_S = 60.0  # a session's hard deadline: its audio plus this (connect, joins, the last answers)


def b64_samples(delta: str) -> int:
    """pcm16 samples in a base64 ``delta`` without decoding it (the client only counts)."""
    nbytes = len(delta) // 4 * 3 - (2 if delta.endswith("==") else 1 if delta.endswith("=") else 0)
    return nbytes // 2


async def realtime_session(target: str, seconds: float, seed: int, opts: SessionOptions) -> SessionRecord:
    """One session against ``target`` (the gateway's HTTP host:port)."""
    rec = SessionRecord(time.monotonic())
    frames = user_frames_b64(seconds, seed)
    client = shared_client(target)
    update = {"type": "realtime", "instructions": opts.persona, "audio": {"output": {"voice": opts.voice}}}
    done = asyncio.Event()
    try:
        deadline = asyncio.timeout(seconds + SESSION_SLACK_S)
        async with deadline, client.realtime.connect(model=opts.model) as conn:

            async def send_all() -> None:
                try:
                    await conn.session.update(session=update)  # type: ignore[arg-type]
                    await paced(frames, rec, lambda audio: conn.input_audio_buffer.append(audio=audio))
                    await asyncio.sleep(opts.grace_s)  # the last answers
                finally:
                    done.set()

            sender: asyncio.Task[None] | None = None
            closer: asyncio.Task[None] | None = None
            try:
                async for event in conn:
                    now = time.monotonic()
                    kind = event.type
                    if kind == "response.output_audio.delta":
                        rec.audio.append((now, b64_samples(event.delta)))
                    elif kind == "response.output_audio_transcript.delta":
                        rec.transcript_chars += len(event.delta)
                    elif kind == "session.created" and sender is None:
                        rec.opened_at = now
                        sender = asyncio.create_task(send_all())
                        closer = asyncio.create_task(_close_when(done, conn))
                    elif kind == "error":
                        err = event.error
                        rec.error(err.code or err.type or "error", err.message)
            except ConnectionClosed as exc:
                code = exc.rcvd.code if exc.rcvd is not None else 1006
                rec.error(f"WS_CLOSE_{code}", exc.rcvd.reason if exc.rcvd is not None else "no close frame")
            else:
                if not done.is_set():
                    rec.error("WS_CLOSED_EARLY", f"closed after {rec.frames_sent} of {len(frames)} frames")
            finally:
                for task in (sender, closer):
                    if task is not None:
                        task.cancel()
                        with contextlib.suppress(asyncio.CancelledError, Exception):
                            await task  # its failure is the socket's, recorded above
    except TimeoutError:
        rec.error("TIMEOUT", f"session not over {seconds + SESSION_SLACK_S:.0f} s after it started")
    except Exception as exc:  # noqa: BLE001 - a failed session is a record with its error, not a crash
        rec.error(type(exc).__name__, str(exc))
    return rec


_CLIENTS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, AsyncOpenAI]] = (
    weakref.WeakKeyDictionary()
)


def shared_client(target: str) -> AsyncOpenAI:
    """One ``AsyncOpenAI`` per client process's loop and target, as a user's program keeps one: building one
    takes tens of ms on the loop, which stalled the process's other sessions when each session built its own.
    Each session still opens its own WebSocket (``realtime.connect``)."""
    clients = _CLIENTS.setdefault(asyncio.get_running_loop(), {})
    if target not in clients:
        # max_retries=0: a refusal is a result here, not something to retry.
        clients[target] = AsyncOpenAI(base_url=f"http://{target}/v1", api_key="unused", max_retries=0)
    return clients[target]


# One of each event kind a session parses (its first parse builds the event models' validators).
_RESPONSE = {"id": "r", "object": "realtime.response"}
_WARM_EVENTS = tuple(
    json.dumps({"type": kind, "event_id": "warm", **fields})
    for kind, fields in (
        ("session.created", {"session": {"type": "realtime", "model": "warm"}}),
        ("session.updated", {"session": {"type": "realtime", "model": "warm"}}),
        # The first parse of a response event builds its models' validators: 19 ms on the CI box, taken
        # by each client process just as its first session's audio began.
        ("response.created", {"response": {**_RESPONSE, "status": "in_progress"}}),
        ("response.done", {"response": {**_RESPONSE, "status": "completed"}}),
        ("response.output_audio.delta", {"delta": "", "response_id": "r", "item_id": "i", "output_index": 0,
                                         "content_index": 0}),
        ("response.output_audio_transcript.delta", {"delta": "", "response_id": "r", "item_id": "i",
                                                    "output_index": 0, "content_index": 0}),
        ("error", {"error": {"type": "warm", "message": "warm"}}),
    )
)  # fmt: skip


_WARM_SENDS = (
    {"type": "session.update", "session": {"type": "realtime", "instructions": "warm",
                                           "audio": {"output": {"voice": "warm"}}}},
    {"type": "input_audio_buffer.append", "audio": ""},
)  # fmt: skip
# What `AsyncRealtimeConnection.send` transforms a plain event against (openai 3.57).
_CLIENT_EVENT = RealtimeClientEventParam | ResponseCreateEventWithReferencesParam


async def warm_client(target: str) -> None:
    """Before a level's clock, in each client process: its one client and the ``openai`` package's lazy
    first uses (the realtime resource, the first parse of each event kind). Left to the first session they
    blocked a client process's loop for 0.25 s (the 2-core box) to 0.6 s (H200) while all of its sessions
    were joining, so the first level's first audio carried them and the next level's did not."""
    shared_client(target).realtime  # noqa: B018 - built on first access
    # Two imports the first session of a process made on its loop, in every process at once as the level
    # joined (profiled on the CI box: 14 and 18 ms, the first level's largest loop blocks): `connect`'s
    # WebSocket module, and anyio's asyncio backend, which the first `send` loads to name its task.
    importlib.import_module("openai.lib._websocket")
    anyio.get_current_task()
    # The first `send` of each event kind resolves its TypedDicts' type hints (3-6 ms there).
    for event in _WARM_SENDS:
        await async_maybe_transform(event, _CLIENT_EVENT)
    for raw in _WARM_EVENTS:
        AsyncRealtimeConnection.parse_event(cast(Any, None), raw)  # it uses no connection state


async def _close_when(done: asyncio.Event, conn: object) -> None:
    await done.wait()
    await conn.close()  # type: ignore[attr-defined]  # ends the receive loop (1000, as a user hangs up)


def main() -> None:
    run_cli(__doc__, "32,64", "bench.realtime_loadgen", "realtime_session", "http")


if __name__ == "__main__":
    main()
