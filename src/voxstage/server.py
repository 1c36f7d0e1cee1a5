"""gRPC server bootstrap shared by every stage process.

One place decides how a voxstage process serves: grpc.aio on one event loop, explicit message-size and
keepalive options, standard health and reflection, readiness only after warm-up, and a graceful drain on
SIGTERM (health flips to NOT_SERVING, new streams are refused, in-flight streams get ``grace`` seconds).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
import threading
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from prometheus_client import make_wsgi_app

from voxstage.heap import watch_gc_pauses
from voxstage.loop_lag import watch_loop_lag
from voxstage.metrics import REGISTRY

log = logging.getLogger(__name__)

MAX_MESSAGE_BYTES = 64 * 1024 * 1024
SERVER_OPTIONS: list[tuple[str, Any]] = [
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    # Duplex sessions idle for long stretches; let clients keep the connection warm with pings.
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_recv_ping_interval_without_data_ms", 10_000),
    ("grpc.http2.max_ping_strikes", 0),
    # gRPC's default SO_REUSEPORT lets a second server bind a port already in use, and the kernel then splits
    # connections between the two (a client of one gets UNIMPLEMENTED from the other). A port clash must fail
    # at start-up instead.
    ("grpc.so_reuseport", 0),
]
CHANNEL_OPTIONS: list[tuple[str, Any]] = [
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.keepalive_time_ms", 20_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.enable_retries", 0),
]


@dataclass
class ServiceBinding:
    """One servicer to mount: ``add(servicer, server)`` is the generated ``add_XServicer_to_server``."""

    full_name: str
    servicer: Any
    add: Callable[[Any, grpc.aio.Server], None]


@dataclass
class StageServer:
    """A running stage process's gRPC face; ``draining`` tells servicers to refuse new streams."""

    server: grpc.aio.Server
    health: health.aio.HealthServicer
    port: int
    services: Sequence[str]
    draining: bool = False
    _stopped: asyncio.Event = field(default_factory=asyncio.Event)

    async def set_ready(self) -> None:
        for name in ("", *self.services):
            await self.health.set(name, health_pb2.HealthCheckResponse.SERVING)

    async def drain(self, grace: float) -> None:
        """Refuse new work, let in-flight streams finish for up to ``grace`` seconds, then stop."""
        if self.draining:
            return
        self.draining = True
        await self.health.enter_graceful_shutdown()
        await self.server.stop(grace)
        self._stopped.set()

    async def wait_stopped(self) -> None:
        await self._stopped.wait()
        await self.server.wait_for_termination()


class _MetricsHandler(WSGIRequestHandler):
    # socketserver sets TCP_NODELAY on an accepted connection only when asked, and prometheus_client's
    # start_http_server does not ask: wsgiref writes the headers and the body apart, so the body could wait
    # for the scraper's delayed ACK (issue 29: the gateway's HTTP face lost ~40 ms that way).
    disable_nagle_algorithm = True

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        """Scrapes are not log lines."""


class _MetricsServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True  # a scrape in flight never holds the process open


def start_metrics_server(port: int, host: str) -> WSGIServer:
    """``/metrics`` of ``REGISTRY`` on ``host:port`` (``prometheus_client.start_http_server``'s server, with
    TCP_NODELAY on its connections), served by a daemon thread."""
    family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]
    server_class = type("MetricsServer", (_MetricsServer,), {"address_family": family})
    httpd = make_server(host, port, make_wsgi_app(REGISTRY), server_class, handler_class=_MetricsHandler)
    threading.Thread(target=httpd.serve_forever, name="metrics", daemon=True).start()
    return httpd


async def start_stage_server(
    bindings: Sequence[ServiceBinding],
    *,
    host: str = "0.0.0.0",
    port: int = 0,
    metrics_port: int | None = None,
    interceptors: Sequence[grpc.aio.ServerInterceptor] = (),
    credentials: grpc.ServerCredentials | None = None,
    reflection_on: bool = True,
    max_receive_bytes: int | None = None,
) -> StageServer:
    """Create, mount and start the server; health reports NOT_SERVING until ``set_ready``. The gateway's
    public port adds its API-key ``interceptors``, TLS ``credentials``, may turn reflection off, and
    receives no message larger than its largest valid request (``max_receive_bytes``)."""
    watch_gc_pauses()
    watch_loop_lag()
    options = list(SERVER_OPTIONS)
    if max_receive_bytes is not None:
        options = [o for o in options if o[0] != "grpc.max_receive_message_length"]
        options.append(("grpc.max_receive_message_length", max_receive_bytes))
    server = grpc.aio.server(options=options, interceptors=list(interceptors))
    for b in bindings:
        b.add(b.servicer, server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    names = [b.full_name for b in bindings]
    for name in ("", *names):
        await health_servicer.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
    if reflection_on:
        reflection.enable_server_reflection((*names, health.SERVICE_NAME, reflection.SERVICE_NAME), server)
    try:
        address = f"{host}:{port}"
        if credentials is None:
            bound = server.add_insecure_port(address)
        else:
            bound = server.add_secure_port(address, credentials)
    except RuntimeError:  # grpc raises this when the bind fails (port in use, no permission)
        bound = 0
    if bound == 0:
        raise OSError(f"cannot bind gRPC port {host}:{port} (in use, or not permitted)")
    await server.start()
    if metrics_port is not None:
        start_metrics_server(metrics_port, host)
    log.info("gRPC on %s:%d (%s)", host, bound, ", ".join(names))
    return StageServer(server=server, health=health_servicer, port=bound, services=names)


async def run_until_signalled(
    stage: StageServer, *, grace: float, on_stop: Callable[[], Awaitable[None]] | None = None
) -> None:
    """Serve until SIGTERM/SIGINT, then drain gracefully and run ``on_stop`` (engine shutdown)."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    waiter = asyncio.ensure_future(stage.server.wait_for_termination())
    signalled = asyncio.ensure_future(stop.wait())
    await asyncio.wait({waiter, signalled}, return_when=asyncio.FIRST_COMPLETED)
    if signalled.done():
        log.info("signal received: draining for up to %.1f s", grace)
        await stage.drain(grace)
    waiter.cancel()
    signalled.cancel()
    if on_stop is not None:
        await on_stop()
