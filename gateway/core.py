"""The gateway's shared state: replica pools, admission, the synthesizer, duplex sessions, the served model.

Both faces (gRPC and HTTP) hold one ``GatewayCore``. It owns the background probes of every stage replica,
derives readiness (at least one ready codec and one ready talker) and rebuilds the model catalog when the
talker reports a different model.

Readiness is computed from the replica pools whenever it is read, so ``/health``'s ``status`` can never
disagree with its ``codec_ready`` / ``talker_ready`` (it used to be a snapshot refreshed every 0.5 s, which
said "ok" next to ``codec_ready: false`` for that long after a codec died). While no codec (or no talker)
is routable the gateway is not ready: ``/health`` answers 503 and gRPC health NOT_SERVING. The gRPC health
follows the pools' change events at once, not on a timer.

Stage addresses that are names are resolved here (gateway/discovery.py): once before the first probes,
then in the background, so replicas come and go without a restart.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence

from gateway.admission import Admission
from gateway.auth import read_link_tls
from gateway.catalog import ModelInfo, build_model_info
from gateway.discovery import Discovery
from gateway.duplex.sessions import SessionManager
from gateway.quotas import ClientLimits, Quotas
from gateway.routing import ReplicaPool, codec_status, talker_status
from gateway.tasks import cancel_and_wait, wait_event
from gateway.tts.synthesis import Synthesizer
from gateway.voices.library import VoiceLibrary
from voxstage.config import DeployConfig
from voxstage.resolver import Resolver, SystemResolver
from voxstage.transport.shm_reader import ShmReader

log = logging.getLogger(__name__)

PROBE_INTERVAL_S = 2.0


class GatewayCore:
    def __init__(
        self,
        config: DeployConfig,
        codec_addresses: Sequence[str],
        talker_addresses: Sequence[str],
        *,
        probe_interval_s: float = PROBE_INTERVAL_S,
        resolver: Resolver | None = None,
    ) -> None:
        self.config = config
        gw = config.gateway
        # A name among the addresses becomes its endpoints at start(): the pools start with the IPs only.
        link = read_link_tls(gw)  # mTLS to the stages (gateway.link_*); a bad file fails the start here
        self.codecs = ReplicaPool("codec", codec_addresses, codec_status, static_only=True, tls=link)
        self.talkers = ReplicaPool("talker", talker_addresses, talker_status, static_only=True, tls=link)
        resolver = resolver or SystemResolver.from_env()
        self.discovery = [
            Discovery(self.codecs, codec_addresses, resolver, gw.discovery_interval_s),
            Discovery(self.talkers, talker_addresses, resolver, gw.discovery_interval_s),
        ]
        # Fair sharing (quotas.py): per connection here; GatewayServer.start swaps in per-key limits when
        # API keys are on.
        self.quotas = Quotas(
            per_connection=ClientLimits(
                gw.connection_max_streams, gw.connection_max_sessions, gw.connection_rate
            )
        )
        self.admission = Admission(
            config.admission_limit, max_queue=gw.max_queue, queue_timeout_s=gw.queue_timeout_s
        )
        # The codec applies its input connector to the gateway stream too (docs/protocol.md §9), so the
        # gateway reads shared-memory PCM whenever the deploy file turns the fast path on.
        self.shm_reader = ShmReader() if config.shared_memory else None
        self.synth = Synthesizer(
            config, self.codecs, self.talkers, self.admission, shm_reader=self.shm_reader
        )
        self.sessions = SessionManager(
            config, self.codecs, self.talkers, model=lambda: self._model, shm_reader=self.shm_reader
        )
        # The voice library (gateway.voice_store_dir): uploads encoded by a codec, stored on a directory
        # every replica of this gateway may share.
        self.voices = VoiceLibrary(gw, self.codecs, gw.voice_aliases)
        self.sessions.voices = self.voices
        self.probe_interval_s = probe_interval_s
        self._model: ModelInfo | None = None
        self._model_key: tuple[str, str, int, tuple[int, int]] | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._on_readiness: list[Callable[[bool], Awaitable[None]]] = []
        self._ready = False  # the readiness last announced to the callbacks (gRPC health)
        self._kick = asyncio.Event()  # a replica went down or came back: refresh now
        self.codecs.on_change(self._kick.set)
        self.talkers.on_change(self._kick.set)

    # -- lifecycle --------------------------------------------------------------------------------------

    async def start(self) -> None:
        discovering = [d for d in self.discovery if d.active]
        if not discovering and "discovery_interval_s" in self.config.gateway.model_fields_set:
            log.warning("gateway.discovery_interval_s has no effect: every stage address is an IP literal")
        await asyncio.gather(*(d.resolve_now() for d in discovering))
        await asyncio.gather(self.codecs.probe_all(force=True), self.talkers.probe_all(force=True))
        await self._refresh()
        self._tasks = [
            asyncio.create_task(self.codecs.run(self.probe_interval_s)),
            asyncio.create_task(self.talkers.run(self.probe_interval_s)),
            asyncio.create_task(self._watch()),
            *(asyncio.create_task(d.run()) for d in discovering),
        ]

    async def stop(self) -> None:
        await cancel_and_wait(self._tasks)
        await self.codecs.close()
        await self.talkers.close()
        if self.shm_reader is not None:
            self.shm_reader.close()

    def on_readiness(self, callback: Callable[[bool], Awaitable[None]]) -> None:
        self._on_readiness.append(callback)

    async def _watch(self) -> None:
        while True:
            # Event-driven (a pool changed); the timeout only catches what no event announces.
            await wait_event(self._kick, min(self.probe_interval_s, 0.5))
            self._kick.clear()
            await self._refresh()

    async def _refresh(self) -> None:
        talker = self.talkers.ready_status()
        codec = self.codecs.ready_status()
        if talker is not None:
            limits = (talker.max_model_len, talker.text_token_limit)  # a restarted talker may differ
            key = (talker.model, talker.family, codec.sample_rate_hz if codec is not None else 0, limits)
            if key != self._model_key and (codec is not None or self._model is None):
                self._model = build_model_info(talker, codec)
                self._model_key = key
                log.info(
                    "serving model %s (%s, %d Hz, %s voices)",
                    self._model.name,
                    self._model.family,
                    self._model.sample_rate_hz,
                    "?" if self._model.voices is None else len(self._model.voices),
                )
        ready = self.ready
        if ready != self._ready:
            self._ready = ready
            for callback in self._on_readiness:
                await callback(ready)

    # -- queries ----------------------------------------------------------------------------------------

    @property
    def ready(self) -> bool:
        """Live: some codec and some talker are routable and ready, and the gateway is not draining."""
        return self.codecs.any_ready and self.talkers.any_ready and not self.admission.draining

    @property
    def model(self) -> ModelInfo | None:
        """What the talker serves; None until a talker has answered ``Status``."""
        return self._model

    async def drain(self) -> None:
        """Refuse new requests (UNAVAILABLE) while admitted ones finish."""
        self.admission.draining = True
        self.sessions.draining = True
        await self._refresh()
