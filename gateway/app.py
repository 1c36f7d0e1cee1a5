"""The gateway process: gRPC (``voxstage.v1.Speech`` + health + reflection) and HTTP on one event loop.

Health turns SERVING once a ready codec and a ready talker have answered ``Status``, and back to
NOT_SERVING while none is (or while draining). On SIGTERM/SIGINT the gateway drains: new requests get
UNAVAILABLE, admitted ones get ``grace`` seconds to finish on both faces, then everything stops.

The HTTP face runs with the limits of ``http.limits`` on slow, stalled and oversized requests.

Security (``auth``, all off by default): API keys on both faces, TLS on both ports, and gRPC reflection and
``/metrics`` switchable off on the public ports (``gateway.api_keys_*``, ``tls_*``, ``reflection``,
``public_metrics``).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import ipaddress
import logging
import signal
import socket
import traceback
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from typing import Any

import grpc
import uvicorn
from google.protobuf.message import DecodeError
from grpc_health.v1 import health, health_pb2
from grpc_reflection.v1alpha import reflection

from gateway.auth import (
    ApiKeyInterceptor,
    KeyCheck,
    PublicHttpGuard,
    load_api_keys,
    load_key_limits,
    read_tls,
)
from gateway.catalog import ModelInfo
from gateway.core import GatewayCore
from gateway.errors import GatewayError, abort, invalid
from gateway.grpc.reflection import SERVICE_NAME as REFLECTION_V1
from gateway.grpc.reflection import reflection_v1_binding
from gateway.grpc.speech import SpeechServicer
from gateway.http.app import build_app
from gateway.http.limits import http_config
from gateway.memory import TRIMMER, tune_allocator
from gateway.message_limits import grpc_max_receive_bytes
from gateway.quotas import Quotas
from gateway.realtime.ws import register_realtime
from gateway.voice_aliases import log_broken_aliases
from voxstage.config import DeployConfig
from voxstage.heap import freeze_startup_heap
from voxstage.server import ServiceBinding, StageServer, start_stage_server
from voxstage.v1 import speech_pb2

log = logging.getLogger(__name__)

SPEECH_SERVICE = "voxstage.v1.Speech"
# The kernel's send buffer of each HTTP/WebSocket connection (the kernel doubles it): 4 s of Realtime audio
# as base64 JSON; it bounds a connection to about 2.6 MB/s per 100 ms of round trip, 13 times a 48 kHz
# float stream.
HTTP_SEND_BUFFER_BYTES = 128 * 1024


def reachable_from_elsewhere(host: str) -> bool:
    """Whether a listen address takes connections from other hosts: anything but loopback (``0.0.0.0`` and
    ``::`` are every interface; a host name other than ``localhost`` is taken to be one too)."""
    if host.lower() == "localhost":
        return False
    try:
        return not ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return True


class _EmbeddedUvicorn(uvicorn.Server):
    """uvicorn without its own signal handling: the gateway owns SIGTERM and drains both faces."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class _Undecodable:
    """What the Speech service's request deserializer returns for bytes that do not parse as the method's
    message: the handler then answers INVALID_ARGUMENT. A raising deserializer made grpc.aio answer UNKNOWN
    and log a traceback for every such request on the public port (issue 15)."""

    def __init__(self, error: GatewayError) -> None:
        self.error = error


def _parser(message: Any) -> Callable[[bytes], Any]:
    name = message.DESCRIPTOR.full_name

    def parse(data: bytes) -> Any:
        TRIMMER.seen(len(data))
        try:
            return message.FromString(data)
        except DecodeError:
            log.debug("grpc: %d bytes that are not a %s", len(data), name)
            return _Undecodable(invalid("request", f"not a valid {name} message", reason="malformed_request"))

    return parse


async def _checked(requests: AsyncIterator[Any], seen: list[GatewayError]) -> AsyncIterator[Any]:
    # A bad message in a stream raises where the handler reads it, as its own bad input does.
    async for request in requests:
        if isinstance(request, _Undecodable):
            seen.append(request.error)
            raise request.error
        yield request


def _forget_frames(exc: BaseException) -> None:
    """Drop the locals of the finished frames an RPC's exception carries. grpc.aio keeps the exception that
    ended the last RPC (the AbortError of a refusal, its context the GatewayError) until the next one, and
    with it every frame it passed through: the refused request, megabytes of reference audio, stayed alive
    (issue 26's memory probe)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        traceback.clear_frames(current.__traceback__)
        current = current.__cause__ or current.__context__


def _guarded(behavior: Callable[..., Any], client_streaming: bool) -> Callable[..., Any]:
    async def request_of(request: Any, context: Any) -> Any:
        if isinstance(request, _Undecodable):
            await abort(context, request.error)
        return request

    async def coroutine(request: Any, context: Any) -> Any:
        try:
            if client_streaming:
                # Converse reads in a task and takes any end of its input as a half-close: the status is set
                # here.
                seen: list[GatewayError] = []
                result = await behavior(_checked(request, seen), context)
                if seen:
                    await abort(context, seen[0])
                return result
            return await behavior(await request_of(request, context), context)
        except BaseException as exc:
            _forget_frames(exc)
            request = seen = None  # noqa: F841 - this frame stays in the traceback: it must not keep the request
            raise

    async def generator_(request: Any, context: Any) -> AsyncIterator[Any]:
        # StreamingSynthesize turns an error raised by its input into its status itself.
        try:
            request = _checked(request, []) if client_streaming else await request_of(request, context)
            async with contextlib.aclosing(behavior(request, context)) as responses:
                async for response in responses:
                    yield response
        except BaseException as exc:
            _forget_frames(exc)
            request = None  # noqa: F841 - this frame stays in the traceback: it must not keep the request
            raise

    return generator_ if inspect.isasyncgenfunction(behavior) else coroutine


def add_speech_servicer(servicer: SpeechServicer, server: grpc.aio.Server) -> None:
    """``speech_pb2_grpc.add_SpeechServicer_to_server``, with request deserializers that never raise."""
    service = speech_pb2.DESCRIPTOR.services_by_name["Speech"]
    handlers = {}
    for method in service.methods:
        ends = ["stream" if many else "unary" for many in (method.client_streaming, method.server_streaming)]
        handlers[method.name] = getattr(grpc, f"{ends[0]}_{ends[1]}_rpc_method_handler")(
            _guarded(getattr(servicer, method.name), method.client_streaming),
            request_deserializer=_parser(getattr(speech_pb2, method.input_type.name)),
            response_serializer=getattr(speech_pb2, method.output_type.name).SerializeToString,
        )
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service.full_name, handlers),))
    server.add_registered_method_handlers(service.full_name, handlers)


async def start_public_grpc(
    bindings: Sequence[ServiceBinding],
    *,
    host: str,
    port: int,
    check: KeyCheck,
    tls: tuple[bytes, bytes] | None,
    reflection_on: bool,
    max_receive_bytes: int | None = None,
) -> StageServer:
    """``voxstage.server.start_stage_server`` for the public port: with the API-key interceptor, TLS
    credentials, reflection and the message-size bound (``message_limits``) as configured. Health is
    NOT_SERVING until ``set_ready``."""
    return await start_stage_server(
        bindings,
        host=host,
        port=port,
        interceptors=[ApiKeyInterceptor(check)] if check.enabled else [],
        credentials=None if tls is None else grpc.ssl_server_credentials([(tls[1], tls[0])]),
        reflection_on=reflection_on,
        max_receive_bytes=max_receive_bytes,
    )


class GatewayServer:
    def __init__(
        self,
        config: DeployConfig,
        codecs: Sequence[str],
        talkers: Sequence[str],
        *,
        host: str | None = None,
        grpc_port: int | None = None,
        http_port: int | None = None,
        grace_s: float = 30.0,
    ) -> None:
        gw = config.gateway
        self.host = host or gw.host
        self._grpc_port = gw.grpc_port if grpc_port is None else grpc_port
        self._http_port = gw.http_port if http_port is None else http_port
        self.grace_s = grace_s
        self.core = GatewayCore(config, codecs, talkers)
        self.stage: StageServer | None = None
        self.http: _EmbeddedUvicorn | None = None
        self._http_task: asyncio.Task[None] | None = None
        self.grpc_port = 0
        self.http_port = 0
        self._aliases_checked: ModelInfo | None = None

    async def start(self) -> None:
        gw = self.core.config.gateway
        check = KeyCheck(load_api_keys(gw))  # read before anything binds: a bad setting fails fast
        if check.enabled:
            self.core.quotas = Quotas(load_key_limits(gw), match=check.match)
            for key in sorted({"connection_max_streams", "connection_max_sessions", "connection_rate"}
                              & gw.model_fields_set):  # fmt: skip
                log.warning("gateway.%s has no effect: API keys are on, and each key's limits come from its "
                            "line in gateway.api_keys_file", key)  # fmt: skip
        tls = read_tls(gw)
        bindings = [ServiceBinding(SPEECH_SERVICE, SpeechServicer(self.core), add_speech_servicer)]
        if gw.reflection:  # v1alpha comes with start_stage_server; v1 is ours (grpc/reflection.py)
            listed = (SPEECH_SERVICE, REFLECTION_V1, health.SERVICE_NAME, reflection.SERVICE_NAME)
            bindings.append(reflection_v1_binding(listed))
        self.stage = await start_public_grpc(
            bindings, host=self.host, port=self._grpc_port, check=check, tls=tls, reflection_on=gw.reflection,
            max_receive_bytes=grpc_max_receive_bytes(gw.max_text_chars),
        )  # fmt: skip
        self.grpc_port = self.stage.port
        tune_allocator()
        TRIMMER.start()
        self.core.on_readiness(self._set_health)
        self.core.on_readiness(self._check_voice_aliases)
        await self.core.start()
        if self.core.ready:
            await self._set_health(True)
            await self._check_voice_aliases(True)
        # IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY on accepted connections only for sockets whose proto
        # says TCP, and with Nagle on, a kept-alive client's first audio chunk waited ~40 ms for its ACK.
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        # Accepted connections inherit it. Autotuned, the kernel buffered up to 4 MB for a client that had
        # stopped reading (a minute of Realtime audio), so no write waited and duplex_send_timeout_s and
        # stream_idle_timeout_s never started: keepalive pings cut the client after 40 s with 1006 instead.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, HTTP_SEND_BUFFER_BYTES)
        sock.bind((self.host, self._http_port))
        self.http_port = sock.getsockname()[1]
        api = build_app(self.core)
        register_realtime(api, self.core)  # the WebSocket face shares the HTTP face's port
        app = PublicHttpGuard(api, check, public_metrics=gw.public_metrics)
        config = http_config(app, gw, grace_s=self.grace_s)
        if tls is not None:
            config.ssl_certfile, config.ssl_keyfile = gw.tls_cert_file, gw.tls_key_file
        self.http = _EmbeddedUvicorn(config)
        self._http_task = asyncio.create_task(self.http.serve(sockets=[sock]))
        while not self.http.started:
            if self._http_task.done():
                self._http_task.result()  # raises the startup failure
            await asyncio.sleep(0.01)
        log.info(
            "gateway: gRPC on %s:%d, HTTP%s on %s:%d (API keys %s, reflection %s, /metrics %s)",
            self.host, self.grpc_port, "S" if tls else "", self.host, self.http_port,
            f"on: {len(check.keys)}" if check.enabled else "off",
            "on" if gw.reflection else "off", "public" if gw.public_metrics else "off",
        )  # fmt: skip
        log.info("gateway: %d start-up objects frozen out of the garbage collector", freeze_startup_heap())
        if not check.enabled and reachable_from_elsewhere(self.host):
            log.warning(
                "gateway: gRPC :%d and HTTP :%d listen on %s with no API keys: anyone who can reach this "
                "host can synthesize on it. Set gateway.api_keys_file or gateway.api_keys_env, or listen on "
                "127.0.0.1 (docs/operations.md, production profile)",
                self.grpc_port, self.http_port, self.host,
            )  # fmt: skip

    async def _check_voice_aliases(self, ready: bool) -> None:
        # Once per model: the voices are only known when a talker has reported what it serves.
        model = self.core.model
        if ready and model is not None and model is not self._aliases_checked:
            self._aliases_checked = model
            log_broken_aliases(model, self.core.config.gateway.voice_aliases)

    async def _set_health(self, ready: bool) -> None:
        if self.stage is None or self.stage.draining:
            return
        if ready:
            await self.stage.set_ready()
            return
        for name in ("", SPEECH_SERVICE):
            await self.stage.health.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)

    async def stop(self) -> None:
        """Drain: refuse new requests, let admitted ones finish within ``grace_s``, then stop."""
        await self.core.drain()
        if self.http is not None:
            self.http.should_exit = True
        if self.stage is not None:
            await self.stage.drain(self.grace_s)
        if self._http_task is not None:
            # Not ``suppress(CancelledError)``: that would swallow a cancellation of this stop too.
            await asyncio.wait([self._http_task])
            if not self._http_task.cancelled() and (error := self._http_task.exception()) is not None:
                raise error
        await TRIMMER.stop()
        await self.core.stop()

    async def serve_forever(self) -> None:
        await self.start()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError):
                loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        log.info("signal received: draining for up to %.1f s", self.grace_s)
        await self.stop()
