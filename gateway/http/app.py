"""The HTTP face (FastAPI, served by uvicorn on the gateway's event loop).

``POST /v1/audio/speech`` follows OpenAI's speech API: ``model``, ``input``, ``voice``, ``instructions``,
``response_format``, ``speed`` (1.0 only), ``stream_format`` (``audio`` or ``sse``), plus voxstage fields:
``stream``, ``sample_rate``, ``seed``, ``language``, ``ref_audio`` / ``ref_text`` (voice clone) and sampling
overrides; its body and delivery (streamed by default, WAV whole unless ``stream: true``) are
``http.speech``'s. Errors use OpenAI's body, ``{"error": {"message", "type", "param", "code"}}``, with the
HTTP status of the matching gRPC code.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncGenerator, Callable

import grpc
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from gateway.accounting import RequestAccounting
from gateway.core import GatewayCore
from gateway.errors import (
    GatewayError,
    as_gateway_error,
    openai_body,
    openai_error,
    retry_after_header,
)
from gateway.http.speech import delivery, parse_speech, raw_request, stream, whole_clip
from gateway.http.voices import add_voice_routes
from gateway.memory import TRIMMER
from gateway.message_limits import http_max_body_bytes
from gateway.quotas import STREAM, http_client_of
from gateway.tts.request import HTTP_FIELDS, build_job, check_text
from gateway.tts.synthesis import Event, whole_text
from voxstage import metrics
from voxstage.quote import quoted

log = logging.getLogger(__name__)


def _error_response(err: GatewayError) -> JSONResponse:
    return JSONResponse(openai_body(err), status_code=err.http_status, headers=retry_after_header(err))


def _too_large(message: str) -> GatewayError:
    return GatewayError(
        grpc.StatusCode.INVALID_ARGUMENT, message, field="body", reason="body_too_large", http_status=413
    )


async def _read_body(request: Request, limit: int) -> bytes:
    """The body, refused (413) as soon as it is larger than the largest valid request (message_limits)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise _too_large(f"request body of {quoted(declared)} bytes exceeds the limit of {limit} bytes")
    chunks: list[bytes] = []
    size = 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise _too_large(f"request body exceeds the limit of {limit} bytes")
            chunks.append(chunk)
    except ClientDisconnect:
        # Routine on a public port (a body shorter than its Content-Length, a client that gave up): one line,
        # not the traceback an unexpected error gets.
        log.info("http: client disconnected after %d of %s request body bytes", size, declared or "?")
        gone = "client disconnected before its request body was complete"
        raise GatewayError(
            grpc.StatusCode.CANCELLED, gone, field="body", reason="client_disconnected"
        ) from None
    TRIMMER.seen(size)
    return b"".join(chunks)


def _nothing() -> None:
    pass


async def _holding(
    events: AsyncGenerator[Event, None], release: Callable[[], None]
) -> AsyncGenerator[Event, None]:
    """``events``, with the client's stream (quotas.py) given back once they end or are closed."""
    try:
        async with contextlib.aclosing(events) as inner:
            async for event in inner:
                yield event
    finally:
        release()


def build_app(core: GatewayCore) -> FastAPI:
    app = FastAPI(title="voxstage", docs_url=None, redoc_url=None, openapi_url=None)
    body_limit = http_max_body_bytes(core.config.gateway.max_text_chars)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        body = openai_error(str(exc.detail), status=exc.status_code, code=f"http_{exc.status_code}")
        return JSONResponse(body, status_code=exc.status_code)

    @app.post("/v1/audio/speech")
    async def speech(request: Request) -> Response:
        gw = core.config.gateway
        # HTTP has no client deadline; the lifetime limit (http.limits) is the one that ends a request.
        acct = RequestAccounting("http_speech")
        acct.deadline = acct.arrival + gw.max_stream_lifetime_s
        release = _nothing
        try:
            release = core.quotas.acquire(*http_client_of(request.headers, request.scope), STREAM)
            body = parse_speech(await _read_body(request, body_limit))
            plan = delivery(body)
            acct = RequestAccounting(
                "http_speech_stream" if plan.streaming else "http_speech",
                arrival=acct.arrival,
                whole_clip=not plan.streaming,
                deadline=acct.deadline,
            )
            check_text(body.input, "input", gw.max_text_chars)
            job = await build_job(
                raw_request(body, plan.fmt),
                core.model,
                HTTP_FIELDS,
                max_text_chars=gw.max_text_chars,
                voice_aliases=gw.voice_aliases,
                text=body.input,
                max_frames_limit=core.config.max_frames_limit,
                voices=core.voices,
            )
            run = core.synth.run(job, whole_text(body.input), acct, text_field="input")
            events = _holding(run, release)  # a streamed body outlives this handler: the stream is held
            if plan.streaming:
                return await stream(events, job.fmt, job.sample_rate, sse=plan.sse)
            return await whole_clip(request, events, job.fmt, job.sample_rate, acct)
        except Exception as exc:
            release()
            err = as_gateway_error(exc)
            acct.finish(err.outcome, code=err.code.name)
            return _error_response(err)

    @app.get("/v1/models")
    async def models() -> JSONResponse:
        model = core.model
        data = (
            []
            if model is None
            else [{"id": model.name, "object": "model", "created": 0, "owned_by": "voxstage"}]
        )
        return JSONResponse({"object": "list", "data": data})

    add_voice_routes(app, core, _read_body, _error_response)

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
