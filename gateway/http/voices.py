"""``/v1/audio/voices``: the voice library on the HTTP face (docs/api.md "Voices").

``POST`` takes ``multipart/form-data`` (``name``, ``audio`` file, ``ref_text``, optional ``model``,
``language``, ``description``, ``consent_audio`` file); ``GET`` lists built-in and uploaded voices (marked
``uploaded``); ``GET /{id}`` and ``DELETE /{id}`` take an id or a name. The body is read within its bound
(both files at ``gateway.voice_max_bytes`` and the texts) before the form is parsed, so a large upload is
refused (413) without being spooled anywhere.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import grpc
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.datastructures import UploadFile

from gateway.checks import resolve_model
from gateway.core import GatewayCore
from gateway.errors import GatewayError, as_gateway_error, invalid
from gateway.message_limits import HEADROOM_BYTES, UTF8_MAX
from gateway.voices.library import VoiceUpload, disabled
from gateway.voices.store import MAX_DESCRIPTION_CHARS, MAX_NAME_CHARS
from gateway.voices.views import listing, uploaded_voice, voice_json

TEXT_FIELDS = ("name", "ref_text", "model", "language", "description")
FILE_FIELDS = ("audio", "consent_audio")
_FIELDS = frozenset(TEXT_FIELDS + FILE_FIELDS)


def upload_body_limit(core: GatewayCore) -> int:
    gw = core.config.gateway
    texts = UTF8_MAX * (gw.max_text_chars + MAX_NAME_CHARS + MAX_DESCRIPTION_CHARS + 2 * 64)
    return 2 * gw.voice_max_bytes + texts + HEADROOM_BYTES


def add_voice_routes(
    app: FastAPI,
    core: GatewayCore,
    read_body: Callable[[Request, int], Awaitable[bytes]],
    error_response: Callable[[GatewayError], JSONResponse],
) -> None:
    @app.get("/v1/audio/voices")
    async def voices(model: str = "", language: str = "") -> JSONResponse:
        try:
            current = resolve_model(model, core.model, "model")
            found = listing(current, language, core.voices)
        except Exception as exc:
            return error_response(as_gateway_error(exc))
        return JSONResponse({"object": "list", "voices": [voice_json(v) for v in found]})

    @app.post("/v1/audio/voices")
    async def create(request: Request) -> JSONResponse:
        try:
            if not core.voices.enabled:
                raise disabled()
            upload = await _parse_upload(request, read_body, upload_body_limit(core))
            meta = await core.voices.create(upload, core.model)
            return JSONResponse(voice_json(uploaded_voice(meta, core.model)), status_code=201)
        except Exception as exc:
            return error_response(as_gateway_error(exc))

    @app.get("/v1/audio/voices/{voice_id}")
    async def get(voice_id: str) -> JSONResponse:
        try:
            return JSONResponse(voice_json(uploaded_voice(core.voices.get(voice_id), core.model)))
        except Exception as exc:
            return error_response(as_gateway_error(exc))

    @app.delete("/v1/audio/voices/{voice_id}")
    async def delete(voice_id: str) -> JSONResponse:
        try:
            meta = await core.voices.delete(voice_id, core.model)
            return JSONResponse({"id": meta.id, "name": meta.name, "object": "voice", "deleted": True})
        except Exception as exc:
            return error_response(as_gateway_error(exc))


async def _parse_upload(
    request: Request, read_body: Callable[[Request, int], Awaitable[bytes]], limit: int
) -> VoiceUpload:
    kind = request.headers.get("content-type", "")
    if not kind.lower().startswith("multipart/form-data"):
        raise invalid("body", f"must be multipart/form-data, got {kind or 'no content type'}",
                      reason="bad_content_type")  # fmt: skip
    request._body = await read_body(request, limit)  # noqa: SLF001 - the form parser reads the bounded body
    try:
        form = await request.form(max_files=len(FILE_FIELDS), max_fields=len(TEXT_FIELDS) + 2)
    except Exception as exc:  # starlette's MultiPartException and the parser's own errors
        raise invalid("body", f"not a valid multipart form ({exc})", reason="bad_form") from None
    try:
        unknown = sorted(set(form.keys()) - _FIELDS)
        if unknown:
            raise invalid(unknown[0], f"unknown field; the form takes {', '.join(sorted(_FIELDS))}")
        texts: dict[str, str] = {}
        for key in TEXT_FIELDS:
            values = form.getlist(key)
            if len(values) > 1:
                raise invalid(key, "given more than once")
            value = values[0] if values else ""
            if isinstance(value, UploadFile):
                raise invalid(key, "must be a text field, not a file")
            texts[key] = value
        files: dict[str, bytes | None] = {}
        for key in FILE_FIELDS:
            value = form.get(key)
            if value is None:
                files[key] = None
            elif isinstance(value, str):
                raise invalid(key, "must be a file part (an audio file)")
            else:
                files[key] = await value.read()
    finally:
        await form.close()
    audio = files["audio"]
    if not audio:
        raise GatewayError(grpc.StatusCode.INVALID_ARGUMENT, "required: the sample recording (an audio file)",
                           field="audio", reason="audio_required")  # fmt: skip
    return VoiceUpload(
        name=texts["name"], audio=audio, ref_text=texts["ref_text"], model=texts["model"],
        language=texts["language"], description=texts["description"], consent_audio=files["consent_audio"],
    )  # fmt: skip
