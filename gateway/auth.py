"""Security on the public faces: API keys, TLS material, and what the public ports expose.

Off by default (local use). With ``gateway.api_keys_file`` and/or ``gateway.api_keys_env`` set, every HTTP
route but ``/health`` (and ``/metrics`` while ``gateway.public_metrics`` is on), the ``/v1/realtime``
WebSocket and every gRPC method but health need ``Authorization: Bearer <key>`` (gRPC: ``authorization``
metadata). Keys are compared in constant time and never logged. See docs/api.md, "Authentication and TLS".
"""

from __future__ import annotations

import hmac
import json
import logging
import os
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health

from gateway.errors import openai_error
from gateway.quotas import ClientLimits, LimitsError, parse_key_options
from voxstage.config import GatewayConfig
from voxstage.stage.tls import GATEWAY_KEYS, LinkTls, LinkTlsError, load_link_tls

log = logging.getLogger(__name__)

HEADER = "Authorization"
# gRPC methods that stay open with keys configured: load balancers and orchestrators probe health.
OPEN_GRPC_PREFIXES = (f"/{health.SERVICE_NAME}/",)


class SecurityConfigError(OSError):
    """A security setting that cannot be used as given (a file or variable to read); the message names the
    key. An OSError, as a port that cannot be bound is: ``voxstage gateway`` prints it and exits 1."""


def load_api_keys(gw: GatewayConfig, environ: Any = None) -> tuple[bytes, ...]:
    """The configured keys (empty: authentication off). A configured source that yields no key is an
    error, so a typo never leaves the gateway open."""
    environ = os.environ if environ is None else environ
    keys: list[str] = [key for key, _ in _key_file(gw)]
    if gw.api_keys_env is not None:
        value = environ.get(gw.api_keys_env, "")
        found = [key.strip() for key in value.split(",") if key.strip()]
        if not found:
            raise SecurityConfigError(
                f"gateway.api_keys_env: the environment variable {gw.api_keys_env} is unset or holds no key"
            )
        keys.extend(found)
    for key in keys:
        if any(c.isspace() for c in key) or not key.isprintable():
            raise SecurityConfigError(
                "gateway.api_keys_file/api_keys_env: a key holds whitespace or unprintable characters"
            )
    return tuple(dict.fromkeys(key.encode() for key in keys))


def _key_file(gw: GatewayConfig) -> list[tuple[str, list[str]]]:
    """``(key, options)`` of each line of ``gateway.api_keys_file`` (none without one)."""
    if gw.api_keys_file is None:
        return []
    path = Path(gw.api_keys_file).expanduser()
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise SecurityConfigError(f"gateway.api_keys_file: cannot read {path}: {exc.strerror}") from None
    lines = [line.split("#", 1)[0].split() for line in text.splitlines()]
    found = [(words[0], words[1:]) for words in lines if words]
    if not found:
        raise SecurityConfigError(f"gateway.api_keys_file: {path} holds no key (one a line, # comments)")
    return found


def load_key_limits(gw: GatewayConfig) -> dict[bytes, ClientLimits]:
    """Each key's limits from its line of the key file (``KEY streams=4 sessions=1 rate=2/s name=team``);
    keys without options, and those from ``api_keys_env``, have none (quotas.py)."""
    limits: dict[bytes, ClientLimits] = {}
    for number, (key, options) in enumerate(_key_file(gw), start=1):
        try:
            limits[key.encode()] = parse_key_options(options)
        except LimitsError as exc:  # the line number, never the key
            raise SecurityConfigError(f"gateway.api_keys_file: key {number}: {exc}") from None
    return limits


@dataclass(frozen=True)
class KeyCheck:
    """Checks an ``Authorization`` value against the keys; ``enabled`` is False when none is configured."""

    keys: tuple[bytes, ...]

    @property
    def enabled(self) -> bool:
        return bool(self.keys)

    def allows(self, authorization: str | bytes | None) -> bool:
        return not self.keys or self.match(authorization) is not None

    def match(self, authorization: str | bytes | None) -> bytes | None:
        """The configured key ``authorization`` carries (``Bearer KEY``), or None."""
        if authorization is None or not self.keys:
            return None
        if isinstance(authorization, str):
            authorization = authorization.encode("utf-8", "replace")
        scheme, _, token = authorization.strip().partition(b" ")
        if scheme.lower() != b"bearer":
            return None
        token = token.strip()
        # Every key is compared, so the time taken does not tell which one (or how much of one) matched.
        matched = None
        for key in self.keys:
            if hmac.compare_digest(token, key):
                matched = key
        return matched


def read_tls(gw: GatewayConfig) -> tuple[bytes, bytes] | None:
    """``(certificate chain, private key)`` PEM bytes, or None without TLS."""
    if gw.tls_cert_file is None or gw.tls_key_file is None:
        return None
    pems = []
    for name, value in (("tls_cert_file", gw.tls_cert_file), ("tls_key_file", gw.tls_key_file)):
        path = Path(value).expanduser()
        try:
            pems.append(path.read_bytes())
        except OSError as exc:
            raise SecurityConfigError(f"gateway.{name}: cannot read {path}: {exc.strerror}") from None
    return pems[0], pems[1]


def read_link_tls(gw: GatewayConfig) -> LinkTls | None:
    """The gateway's end of the stage links (``gateway.link_*``), or None: plain gRPC to the stages."""
    try:
        return load_link_tls(
            gw.link_ca_file, gw.link_cert_file, gw.link_key_file, gw.link_server_name, names=GATEWAY_KEYS
        )
    except LinkTlsError as exc:
        raise SecurityConfigError(str(exc)) from None


# -- HTTP / WebSocket ---------------------------------------------------------------------------------------

Scope = dict[str, Any]
ASGIApp = Callable[[Scope, Any, Any], Awaitable[None]]

MISSING_KEY = f"missing or invalid API key: send the header '{HEADER}: Bearer <key>'"


def _header(scope: Scope, name: bytes) -> bytes | None:
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            return value  # type: ignore[no-any-return]
    return None


async def _json(send: Any, status: int, body: dict[str, Any], extra: Sequence[tuple[bytes, bytes]] = (),
                start: str = "http.response.start", chunk: str = "http.response.body") -> None:  # fmt: skip
    data = json.dumps(body).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode()), *extra]
    await send({"type": start, "status": status, "headers": headers})
    await send({"type": chunk, "body": data})


class PublicHttpGuard:
    """ASGI middleware in front of the HTTP face: API keys on every route but the open ones. With
    ``gateway.public_metrics`` off, ``/metrics`` needs a key like every other route, and is hidden (404)
    when no key is configured (nobody could be told apart from the public)."""

    def __init__(self, app: ASGIApp, check: KeyCheck, *, public_metrics: bool = True) -> None:
        self.app = app
        self.check = check
        self.public_metrics = public_metrics
        self.open_paths = {"/health", *(("/metrics",) if public_metrics else ())}

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        kind = scope["type"]
        if kind not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "")
        if path == "/metrics" and not self.public_metrics and not self.check.enabled:
            if kind == "http":
                body = openai_error("not found (gateway.public_metrics is off)", status=404, code="http_404")
                await _json(send, 404, body)
            else:
                await send({"type": "websocket.close", "code": 1008})
            return
        if path in self.open_paths or self.check.allows(_header(scope, b"authorization")):
            await self.app(scope, receive, send)
            return
        body = openai_error(MISSING_KEY, status=401, code="invalid_api_key")
        challenge = [(b"www-authenticate", b'Bearer realm="voxstage"')]
        if kind == "http":
            await _json(send, 401, body, challenge)
        elif "websocket.http.response" in scope.get("extensions", {}):
            # Refused at the handshake with a real 401, as the OpenAI client expects.
            start, chunk = "websocket.http.response.start", "websocket.http.response.body"
            await _json(send, 401, body, challenge, start, chunk)
        else:
            await send({"type": "websocket.close", "code": 1008, "reason": "missing or invalid API key"})


# -- gRPC ---------------------------------------------------------------------------------------------------


def _denial(handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
    async def deny(request: Any, context: grpc.aio.ServicerContext) -> Any:
        await context.abort(
            grpc.StatusCode.UNAUTHENTICATED,
            "missing or invalid API key: send the metadata 'authorization: Bearer <key>'",
        )

    streams = (handler.request_streaming, handler.response_streaming)
    make = {
        (False, False): grpc.unary_unary_rpc_method_handler,
        (False, True): grpc.unary_stream_rpc_method_handler,
        (True, False): grpc.stream_unary_rpc_method_handler,
        (True, True): grpc.stream_stream_rpc_method_handler,
    }[streams]
    return make(deny)  # type: ignore[no-any-return]


class ApiKeyInterceptor(grpc.aio.ServerInterceptor):
    """Refuses every gRPC method but health without a valid ``authorization: Bearer <key>``."""

    def __init__(self, check: KeyCheck) -> None:
        self.check = check

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        method: str = handler_call_details.method  # type: ignore[attr-defined]
        if handler is None or method.startswith(OPEN_GRPC_PREFIXES):
            return handler
        metadata = handler_call_details.invocation_metadata or ()  # type: ignore[attr-defined]
        value = next((v for k, v in metadata if k == "authorization"), None)
        if self.check.allows(value):
            return handler
        log.info("grpc: %s refused: missing or invalid API key", method)
        return _denial(handler)
