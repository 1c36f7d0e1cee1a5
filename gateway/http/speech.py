"""``POST /v1/audio/speech``: the request body, how its audio is delivered, and the response bodies.

Delivery follows OpenAI's endpoint: audio is streamed (chunked transfer) as it is generated, in every format
``voxstage.formats`` streams by default (all but WAV and FLAC), and the official client's
``with_streaming_response`` gets its first bytes while the rest is still being made. ``stream: false`` asks
for the whole clip in one response (with a Content-Length). WAV is sent whole with exact sizes unless
``stream: true`` asks for its open-length stream (issue 29: a streamed WAV's 0xFFFFFFFF sizes made ``wave``
read 89,478 s); FLAC cannot stream at all. ``stream_format: "sse"`` sends Server-Sent Events. A stream that
fails before its first audio byte gets a normal error status; after that, raw audio is cut off (the chunked
body never terminates cleanly) and SSE ends with an ``error`` event.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from fastapi import Request
from fastapi.responses import Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, ValidationError
from starlette.requests import ClientDisconnect
from starlette.types import Receive, Scope, Send

from gateway.accounting import RequestAccounting
from gateway.errors import GatewayError, as_gateway_error, invalid, openai_body
from gateway.tts.request import HTTP_FIELDS, RawRequest, ReferenceInput, sampling_from
from gateway.tts.synthesis import AudioOut, Event, Finished
from voxstage import formats
from voxstage.audio import AudioError, AudioFormat, StreamingEncoder, encode_clip, parse_format

log = logging.getLogger("voxstage.gateway.http_api")  # one logger for the HTTP face's lines


class VoiceId(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    id: str


class SpeechRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    model: str = ""
    input: str
    voice: str | VoiceId = ""
    instructions: str = ""
    response_format: str | None = None  # see Delivery
    speed: float = 1.0
    stream: bool | None = None  # None: stream when the format streams by default (OpenAI's behaviour)
    stream_format: Literal["audio", "sse"] | None = None
    sample_rate: int | None = None
    seed: int | None = None
    language: str = ""
    ref_audio: str | None = None
    ref_text: str = ""
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    repetition_penalty: float | None = None
    max_frames: int | None = None  # ranges are checked against voxstage.limits, with the field's name


def parse_speech(raw: bytes) -> SpeechRequest:
    try:
        return SpeechRequest.model_validate_json(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        param = ".".join(str(p) for p in first["loc"] if not isinstance(p, int)) or "body"
        if first["type"] == "json_invalid":
            raise invalid("body", f"invalid JSON: {first['msg']}", reason="invalid_json") from None
        if first["type"] == "missing":
            raise invalid(param, "required", reason="missing_field") from None
        if first["type"] == "extra_forbidden":
            raise invalid(param, "unknown parameter", reason="unknown_parameter") from None
        raise invalid(param, first["msg"]) from None


@dataclass(frozen=True)
class Delivery:
    fmt: AudioFormat
    streaming: bool
    sse: bool


def delivery(body: SpeechRequest) -> Delivery:
    """How the audio goes out. The default format is OpenAI's, mp3; a caller that asks for streaming
    explicitly (``stream: true`` or SSE) without naming a format keeps the raw ``pcm`` it always got."""
    sse = body.stream_format == "sse"
    if body.stream is False and sse:
        raise invalid("stream_format", "'sse' needs streaming; remove stream: false")
    insists = body.stream is True or sse
    try:
        fmt = parse_format(body.response_format or ("pcm" if insists else "mp3"))
    except AudioError as exc:
        raise invalid("response_format", str(exc).split(": ", 1)[1], reason="unsupported_format") from None
    if insists and not fmt.streamable:
        raise invalid(
            "response_format",
            f"{fmt.value!r} cannot be streamed; use {', '.join(formats.STREAMING_NAMES)}, or drop "
            f"{'stream_format' if sse else 'stream'} to get it whole",
            reason="unsupported_format",
        )
    return Delivery(fmt, streaming=insists or (body.stream is None and fmt.spec.streamed_by_default), sse=sse)


def raw_request(body: SpeechRequest, fmt: AudioFormat) -> RawRequest:
    if body.speed != 1.0:
        raise invalid("speed", f"only 1.0 is supported, got {body.speed:g}", reason="unsupported_value")
    names = ("temperature", "top_k", "top_p", "repetition_penalty", "max_frames")
    sampling = sampling_from({name: getattr(body, name) for name in names}, HTTP_FIELDS.sampling)
    reference = None
    if body.ref_audio is not None:
        # Kept as text: base64 and audio are decoded in a worker thread, once the rest has passed.
        reference = ReferenceInput(body.ref_audio, body.ref_text, "ref_audio")
    elif body.ref_text:
        raise invalid("ref_text", "needs ref_audio (the transcript belongs to a reference clip)")
    return RawRequest(
        fmt=fmt,
        model=body.model,
        voice=body.voice.id if isinstance(body.voice, VoiceId) else body.voice,
        language=body.language,
        instructions=body.instructions,
        sample_rate=body.sample_rate or 0,
        seed=body.seed,
        sampling=sampling,
        reference=reference,
    )


def content_type(fmt: AudioFormat, rate: int) -> str:
    if fmt is AudioFormat.PCM:
        return f"audio/pcm;rate={rate};channels=1"
    if fmt is AudioFormat.PCM_F32:
        return f"audio/pcm;rate={rate};channels=1;encoding=float"
    return fmt.content_type


async def _until_disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def whole_clip(
    request: Request,
    events: AsyncGenerator[Event, None],
    fmt: AudioFormat,
    rate: int,
    acct: RequestAccounting,
) -> Response:
    async def collect() -> tuple[list[np.ndarray], Finished | None]:
        parts: list[np.ndarray] = []
        done: Finished | None = None
        async with contextlib.aclosing(events) as stream:
            async for event in stream:
                if isinstance(event, AudioOut):
                    parts.append(event.pcm)
                elif isinstance(event, Finished):
                    done = event
        return parts, done

    # A whole clip sends nothing for seconds, so a client that leaves is only noticed by listening for it.
    work = asyncio.ensure_future(collect())
    gone = asyncio.ensure_future(_until_disconnect(request))
    try:
        await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        if not work.done():
            work.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await work
    if work.cancelled():
        return Response(status_code=499)
    parts, done = work.result()
    pcm = np.concatenate(parts) if parts else np.zeros(0, np.float32)
    audio = encode_clip(pcm, fmt, rate)
    acct.clip_sent()
    headers = {"X-Voxstage-Sample-Rate": str(rate)}
    if done is not None:
        headers["X-Request-Id"] = done.request_id
    return Response(audio, media_type=content_type(fmt, rate), headers=headers)


async def stream(events: AsyncGenerator[Event, None], fmt: AudioFormat, rate: int, *, sse: bool) -> Response:
    encoder = StreamingEncoder(fmt, rate)
    # Pull up to the first audio chunk here, so an early failure still gets a proper error status.
    head: list[Event] = []
    try:
        async for event in events:
            head.append(event)
            if isinstance(event, AudioOut | Finished):
                break
    except BaseException:
        await events.aclose()
        raise

    async def body() -> AsyncIterator[bytes]:
        async with contextlib.aclosing(events) as rest:
            try:
                for event in head:
                    if out := _render(event, encoder, sse):
                        yield out
                async for event in rest:
                    if out := _render(event, encoder, sse):
                        yield out
            except Exception as exc:
                err = as_gateway_error(exc)
                if not sse:
                    response.cut = err  # a truncated stream must not look complete
                    return
                yield f"data: {json.dumps({'type': 'error', **openai_body(err)})}\n\n".encode()
        response.finished = True

    media = "text/event-stream" if sse else content_type(fmt, rate)
    headers = {"X-Voxstage-Sample-Rate": str(rate), "Cache-Control": "no-cache"}
    response = _AudioStream(body(), media_type=media, headers=headers)
    return response


class _AudioStream(StreamingResponse):
    """A streamed body whose every ending is one log line, never an ASGI traceback (issue 15): a client
    that leaves mid-stream is routine (info); a raw stream cut on a failure after its first byte ends
    without the terminating chunk (the server then closes the connection, and the client sees a truncated
    body), since raw audio has no way to carry the error. SSE ends with an ``error`` event instead."""

    cut: GatewayError | None = None
    finished = False
    sent = 0

    async def stream_response(self, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        async for chunk in self.body_iterator:
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
            self.sent += len(chunk)
        if self.cut is not None:
            log.warning("http: stream cut after %d bytes: %s", self.sent, self.cut.text)
            return
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        except (ClientDisconnect, OSError):  # a write to a client that has gone
            pass
        if not self.finished and self.cut is None:  # the client left; the body's close cancelled upstream
            log.info("http: client disconnected mid-stream after %d bytes", self.sent)


def _delta(data: bytes) -> bytes:
    payload: dict[str, Any] = {"type": "speech.audio.delta", "audio": base64.b64encode(data).decode()}
    return f"data: {json.dumps(payload)}\n\n".encode()


def _render(event: Event, encoder: StreamingEncoder, sse: bool) -> bytes:
    if isinstance(event, AudioOut):
        data = encoder.encode(event.pcm)
        return _delta(data) if sse and data else data
    if not isinstance(event, Finished):
        return b""
    tail = encoder.close()  # what an MP3 or Opus encoder still held: the stream's last frames
    if not sse:
        return tail
    summary = {
        "request_id": event.request_id,
        "audio_seconds": event.audio_s,
        "frames": event.frames,
        "time_to_first_audio_seconds": event.ttfa_s,
    }
    done = f"data: {json.dumps({'type': 'speech.audio.done', 'voxstage': summary})}\n\n".encode()
    return (_delta(tail) if tail else b"") + done
