"""The gateway process: gRPC (``voxstage.v1.Speech`` + health + reflection) and HTTP on one event loop.

Health turns SERVING once a ready codec and a ready talker have answered ``Status``, and back to
NOT_SERVING while none is (or while draining). On SIGTERM/SIGINT the gateway drains: new requests get
UNAVAILABLE, admitted ones get ``grace`` seconds to finish on both faces, then everything stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
from collections.abc import Iterator, Sequence
from pathlib import Path

import uvicorn
from grpc_health.v1 import health_pb2

from voxstage.config import DeployConfig
from voxstage.gateway.core import GatewayCore
from voxstage.gateway.grpc_api import SpeechServicer
from voxstage.gateway.http_api import build_app
from voxstage.server import ServiceBinding, StageServer, start_stage_server
from voxstage.v1 import speech_pb2_grpc

log = logging.getLogger(__name__)

SPEECH_SERVICE = "voxstage.v1.Speech"


class _EmbeddedUvicorn(uvicorn.Server):
    """uvicorn without its own signal handling: the gateway owns SIGTERM and drains both faces."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


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
        model_dirs: Sequence[Path] = (),
        grace_s: float = 30.0,
    ) -> None:
        gw = config.gateway
        self.host = host or gw.host
        self._grpc_port = gw.grpc_port if grpc_port is None else grpc_port
        self._http_port = gw.http_port if http_port is None else http_port
        self.grace_s = grace_s
        self.core = GatewayCore(config, codecs, talkers, model_dirs=model_dirs)
        self.stage: StageServer | None = None
        self.http: _EmbeddedUvicorn | None = None
        self._http_task: asyncio.Task[None] | None = None
        self.grpc_port = 0
        self.http_port = 0

    async def start(self) -> None:
        binding = ServiceBinding(
            SPEECH_SERVICE, SpeechServicer(self.core), speech_pb2_grpc.add_SpeechServicer_to_server
        )
        self.stage = await start_stage_server([binding], host=self.host, port=self._grpc_port)
        self.grpc_port = self.stage.port
        self.core.on_readiness(self._set_health)
        await self.core.start()
        if self.core.ready:
            await self._set_health(True)
        sock = socket.socket(socket.AF_INET6 if ":" in self.host else socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self._http_port))
        self.http_port = sock.getsockname()[1]
        config = uvicorn.Config(
            build_app(self.core),
            log_level="warning",
            access_log=False,
            lifespan="off",
            timeout_graceful_shutdown=max(int(self.grace_s), 1),
        )
        self.http = _EmbeddedUvicorn(config)
        self._http_task = asyncio.create_task(self.http.serve(sockets=[sock]))
        while not self.http.started:
            if self._http_task.done():
                self._http_task.result()  # raises the startup failure
            await asyncio.sleep(0.01)
        log.info(
            "gateway: gRPC on %s:%d, HTTP on %s:%d", self.host, self.grpc_port, self.host, self.http_port
        )

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
            with contextlib.suppress(asyncio.CancelledError):
                await self._http_task
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
