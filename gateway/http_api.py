"""The HTTP face (FastAPI, served by uvicorn on the gateway's event loop).

``POST /v1/audio/speech`` follows OpenAI's speech API: ``model``, ``input``, ``voice``, ``instructions``,
``response_format``, ``speed`` (1.0 only), ``stream_format`` (``audio`` or ``sse``), plus voxstage fields:
``stream``, ``sample_rate``, ``seed``, ``language``, ``ref_audio`` / ``ref_text`` (voice clone) and sampling
overrides. Errors use OpenAI's body, ``{"error": {"message", "type", "param", "code"}}``, with the HTTP
status of the matching gRPC code. A streamed response that fails before its first audio byte gets a normal
error status; after that, raw audio is cut off (the chunked body never terminates cleanly) and SSE ends
with an ``error`` event.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any, Literal

import grpc
import numpy as np
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, ConfigDict, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.types import Receive, Scope, Send

from voxstage import metrics
from voxstage.audio import AudioError, AudioFormat, StreamingEncoder, encode_clip, parse_format
from voxstage.gateway.accounting import RequestAccounting
from voxstage.gateway.core import GatewayCore
from voxstage.gateway.errors import (
    GatewayError,
    invalid,
    not_found,
    openai_body,
    openai_error,
    retry_after_header,
)
from voxstage.gateway.grpc_api import as_gateway_error, voices_of
from voxstage.gateway.realtime_ws import register_realtime
from voxstage.gateway.request import (
    HTTP_FIELDS,
    RawRequest,
    ReferenceInput,
    build_job,
    check_text,
    sampling_from,
)
from voxstage.gateway.synthesis import AudioOut, Event, Finished, whole_text

# Reference audio is capped at 10 MiB; base64 inflates it by 4/3, plus room for the other fields.
MAX_BODY_BYTES = 14 * 1024 * 1024
log = logging.getLogger(__name__)


class VoiceId(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    id: str


class SpeechRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    model: str = ""
    input: str
    voice: str | VoiceId = ""
    instructions: str = ""
    response_format: str | None = None  # mp3 (OpenAI's default) for a whole clip, pcm when streaming
    speed: float = 1.0
    stream: bool | None = None
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


def _error_response(err: GatewayError) -> JSONResponse:
    return JSONResponse(openai_body(err), status_code=err.http_status, headers=retry_after_header(err))


def _raw_request(body: SpeechRequest, streaming: bool) -> RawRequest:
    try:
        fmt = parse_format(body.response_format or ("pcm" if streaming else "mp3"))
    except AudioError as exc:
        raise invalid("response_format", str(exc).split(": ", 1)[1], reason="unsupported_format") from None
    if streaming and not fmt.streamable:
        raise invalid(
            "response_format",
            f"{fmt.value!r} cannot be streamed; use pcm, pcm_f32, wav, mulaw or alaw, or drop stream",
            reason="unsupported_format",
        )
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


def _content_type(fmt: AudioFormat, rate: int) -> str:
    if fmt is AudioFormat.PCM:
        return f"audio/pcm;rate={rate};channels=1"
    if fmt is AudioFormat.PCM_F32:
        return f"audio/pcm;rate={rate};channels=1;encoding=float"
    return fmt.content_type


def _too_large(message: str) -> GatewayError:
    return GatewayError(
        grpc.StatusCode.INVALID_ARGUMENT, message, field="body", reason="body_too_large", http_status=413
    )


async def _read_body(request: Request) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise _too_large(f"request body of {declared} bytes exceeds the limit of {MAX_BODY_BYTES} bytes")
    chunks: list[bytes] = []
    size = 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > MAX_BODY_BYTES:
                raise _too_large(f"request body exceeds the limit of {MAX_BODY_BYTES} bytes")
            chunks.append(chunk)
    except ClientDisconnect:
        # Routine on a public port (a body shorter than its Content-Length, a client that gave up): one line,
        # not the traceback an unexpected error gets.
        log.info("http: client disconnected after %d of %s request body bytes", size, declared or "?")
        gone = "client disconnected before its request body was complete"
        raise GatewayError(
            grpc.StatusCode.CANCELLED, gone, field="body", reason="client_disconnected"
        ) from None
    return b"".join(chunks)


def _parse(raw: bytes) -> SpeechRequest:
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


async def _until_disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


def build_app(core: GatewayCore) -> FastAPI:
    app = FastAPI(title="voxstage", docs_url=None, redoc_url=None, openapi_url=None)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        body = openai_error(str(exc.detail), status=exc.status_code, code=f"http_{exc.status_code}")
        return JSONResponse(body, status_code=exc.status_code)

    @app.post("/v1/audio/speech")
    async def speech(request: Request) -> Response:
        acct = RequestAccounting("http_speech")
        try:
            body = _parse(await _read_body(request))
            if body.stream is False and body.stream_format == "sse":
                raise invalid("stream_format", "'sse' needs streaming; remove stream: false")
            streaming = bool(body.stream) or body.stream_format == "sse"
            acct = RequestAccounting(
                "http_speech_stream" if streaming else "http_speech",
                arrival=acct.arrival,
                whole_clip=not streaming,
            )
            check_text(body.input, "input", core.config.gateway.max_text_chars)
            job = await build_job(
                _raw_request(body, streaming),
                core.model,
                HTTP_FIELDS,
                max_text_chars=core.config.gateway.max_text_chars,
            )
            events = core.synth.run(job, whole_text(body.input), acct, text_field="input")
            if streaming:
                return await _stream(events, job.fmt, job.sample_rate, sse=body.stream_format == "sse")
            return await _whole_clip(request, events, job.fmt, job.sample_rate, acct)
        except Exception as exc:
            err = as_gateway_error(exc)
            acct.finish(err.outcome)
            return _error_response(err)

    register_realtime(app, core)

    @app.get("/v1/models")
    async def models() -> JSONResponse:
        model = core.model
        data = (
            []
            if model is None
            else [{"id": model.name, "object": "model", "created": 0, "owned_by": "voxstage"}]
        )
        return JSONResponse({"object": "list", "data": data})

    @app.get("/v1/audio/voices")
    async def voices(model: str = "", language: str = "") -> JSONResponse:
        current = core.model
        if current is None:
            return _error_response(
                GatewayError(
                    grpc.StatusCode.UNAVAILABLE,
                    "no talker has reported its model yet",
                    field="talker",
                    retry_after_s=1.0,
                )
            )
        if model and model not in (current.name, *current.aliases):
            return _error_response(
                not_found(
                    "model",
                    f"model {model!r} is not served here; served: {current.name}",
                    reason="model_not_found",
                )
            )
        out = [
            {
                "name": v.name,
                "model": v.model,
                "languages": list(v.languages),
                "description": v.description,
                "native_sample_rate_hz": v.native_sample_rate_hz,
            }
            for v in voices_of(current, language)
        ]
        return JSONResponse({"voices": out})

    @app.get("/health")
    async def health() -> JSONResponse:
        body = {
            "status": "ok" if core.ready else "unavailable",
            "codec_ready": core.codecs.any_ready,
            "talker_ready": core.talkers.any_ready,
            "draining": core.admission.draining,
        }
        return JSONResponse(body, status_code=200 if core.ready else 503)

    @app.get("/metrics")
    async def metrics_endpoint() -> Response:
        return Response(generate_latest(metrics.REGISTRY), media_type=CONTENT_TYPE_LATEST)

    return app


async def _whole_clip(
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
    return Response(audio, media_type=_content_type(fmt, rate), headers=headers)


async def _stream(events: AsyncGenerator[Event, None], fmt: AudioFormat, rate: int, *, sse: bool) -> Response:
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
                    if (out := _render(event, encoder, sse)) is not None:
                        yield out
                async for event in rest:
                    if (out := _render(event, encoder, sse)) is not None:
                        yield out
            except Exception as exc:
                err = as_gateway_error(exc)
                if not sse:
                    response.cut = err  # a truncated stream must not look complete
                    return
                yield f"data: {json.dumps({'type': 'error', **openai_body(err)})}\n\n".encode()
        response.finished = True

    media = "text/event-stream" if sse else _content_type(fmt, rate)
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


def _render(event: Event, encoder: StreamingEncoder, sse: bool) -> bytes | None:
    if isinstance(event, AudioOut):
        data = encoder.encode(event.pcm)
        if not sse:
            return data
        payload: dict[str, Any] = {"type": "speech.audio.delta", "audio": base64.b64encode(data).decode()}
        return f"data: {json.dumps(payload)}\n\n".encode()
    if isinstance(event, Finished) and sse:
        summary = {
            "request_id": event.request_id,
            "audio_seconds": event.audio_s,
            "frames": event.frames,
            "time_to_first_audio_seconds": event.ttfa_s,
        }
        return f"data: {json.dumps({'type': 'speech.audio.done', 'voxstage': summary})}\n\n".encode()
    return None
