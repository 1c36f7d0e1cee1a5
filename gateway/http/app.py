"""The HTTP face (FastAPI, served by uvicorn on the gateway's event loop).

``POST /v1/audio/speech`` follows OpenAI's speech API: ``model``, ``input``, ``voice``, ``instructions``,
``response_format``, ``speed`` (1.0 only), ``stream_format`` (``audio`` or ``sse``), plus voxstage fields:
``stream``, ``sample_rate``, ``seed``, ``language``, ``ref_audio`` / ``ref_text`` (voice clone) and sampling
overrides; its body and delivery (streamed by default, as OpenAI's) are ``http_speech``. Errors use
OpenAI's body, ``{"error": {"message", "type", "param", "code"}}``, with the HTTP status of the matching
gRPC code.
"""

from __future__ import annotations

import logging

import grpc
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from gateway.accounting import RequestAccounting
from gateway.catalog import voices_of
from gateway.core import GatewayCore
from gateway.errors import (
    GatewayError,
    as_gateway_error,
    not_found,
    openai_body,
    openai_error,
    retry_after_header,
)
from gateway.http.speech import delivery, parse_speech, raw_request, stream, whole_clip
from gateway.tts.request import HTTP_FIELDS, build_job, check_text
from gateway.tts.synthesis import whole_text
from voxstage import metrics

# Reference audio is capped at 10 MiB; base64 inflates it by 4/3, plus room for the other fields.
MAX_BODY_BYTES = 14 * 1024 * 1024
log = logging.getLogger(__name__)


def _error_response(err: GatewayError) -> JSONResponse:
    return JSONResponse(openai_body(err), status_code=err.http_status, headers=retry_after_header(err))


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


def build_app(core: GatewayCore) -> FastAPI:
    app = FastAPI(title="voxstage", docs_url=None, redoc_url=None, openapi_url=None)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        body = openai_error(str(exc.detail), status=exc.status_code, code=f"http_{exc.status_code}")
        return JSONResponse(body, status_code=exc.status_code)

    @app.post("/v1/audio/speech")
    async def speech(request: Request) -> Response:
        gw = core.config.gateway
        # HTTP has no client deadline; the lifetime limit (http_limits) is the one that ends a request.
        acct = RequestAccounting("http_speech")
        acct.deadline = acct.arrival + gw.max_stream_lifetime_s
        try:
            body = parse_speech(await _read_body(request))
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
            )
            events = core.synth.run(job, whole_text(body.input), acct, text_field="input")
            if plan.streaming:
                return await stream(events, job.fmt, job.sample_rate, sse=plan.sse)
            return await whole_clip(request, events, job.fmt, job.sample_rate, acct)
        except Exception as exc:
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
