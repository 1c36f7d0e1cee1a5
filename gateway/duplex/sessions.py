"""Full-duplex session admission at the gateway, shared by ``/v1/realtime`` and ``Converse``.

A session is admitted when the client connects (the WebSocket is accepted, or the ``Converse`` call starts)
and counts against ``duplex_session.max_sessions`` until it closes, whether or not it has sent audio yet:
each live session stands for one talker slot and one codec stream (docs/configuration.md), which it takes
at its first audio. Beyond the cap the client is refused at once with RESOURCE_EXHAUSTED; the stages'
own refusal (no talker slot or codec stream free) reaches the client the same way when the session starts.
Sessions never queue: a conversation that waits for a slot is not a conversation.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import grpc

from gateway.catalog import ModelInfo
from gateway.duplex.session import DuplexSession, SessionLimits
from gateway.duplex.settings import SessionSettings, session_mode_error
from gateway.errors import GatewayError
from gateway.routing import ReplicaPool
from gateway.upstream import Timeouts
from gateway.voices.library import VoiceLibrary
from voxstage import metrics
from voxstage.config import DeployConfig
from voxstage.duplex import SAMPLE_RATE
from voxstage.transport.shm_reader import ShmReader

log = logging.getLogger(__name__)

RETRY_AFTER_S = 1.0


class SessionManager:
    def __init__(
        self,
        config: DeployConfig,
        codecs: ReplicaPool,
        talkers: ReplicaPool,
        *,
        model: Callable[[], ModelInfo | None],
        shm_reader: ShmReader | None = None,
    ) -> None:
        self.config = config
        self.mode = config.session_mode
        self.max_sessions = config.duplex_max_sessions or 0
        self.codecs = codecs
        self.talkers = talkers
        self._model = model
        self.shm_reader = shm_reader
        self.voices: VoiceLibrary | None = None  # the gateway's voice library (GatewayCore sets it)
        gw = config.gateway
        extra = config.stream
        self.limits = SessionLimits(
            idle_timeout_s=gw.duplex_idle_timeout_s,
            max_duration_s=gw.duplex_max_session_s,
            timeouts=Timeouts(first_chunk_s=extra.first_chunk_timeout_s, stall_s=extra.stall_timeout_s),
            max_text_chars=gw.max_text_chars,
            first_audio_samples=round(config.duplex.first_audio_gather_s * SAMPLE_RATE),
        )
        self.live: set[DuplexSession] = set()
        self.draining = False
        metrics.DUPLEX_SESSIONS.set(0)

    @property
    def model(self) -> ModelInfo | None:
        return self._model()

    @property
    def enabled(self) -> bool:
        return self.mode == "duplex"

    def refuse(self, reason: str, err: GatewayError) -> GatewayError:
        metrics.DUPLEX_REFUSED.labels(reason=reason).inc()
        return err

    def admit(self) -> DuplexSession:
        """A new session, or a GatewayError saying why there is none (counted by reason)."""
        if not self.enabled:
            raise self.refuse("session_mode", session_mode_error(self.mode))
        if self.draining:
            raise self.refuse(
                "draining",
                GatewayError(
                    grpc.StatusCode.UNAVAILABLE,
                    "the gateway is draining; open the session on another instance",
                    field="admission",
                    reason="draining",
                ),
            )
        if len(self.live) >= self.max_sessions:
            raise self.refuse(
                "max_sessions",
                GatewayError(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"{len(self.live)} duplex sessions are live, the limit of this deployment "
                    f"(duplex_session.max_sessions {self.max_sessions}); retry later",
                    field="admission",
                    retry_after_s=RETRY_AFTER_S,
                    reason="session_limit_reached",
                ),
            )
        model = self.model
        settings = SessionSettings(model=model.name if model is not None else "")
        session = DuplexSession(self, settings)
        self.live.add(session)
        metrics.DUPLEX_SESSIONS.set(len(self.live))
        return session

    def release(self, session: DuplexSession) -> None:
        self.live.discard(session)
        metrics.DUPLEX_SESSIONS.set(len(self.live))
