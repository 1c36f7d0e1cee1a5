"""The deploy file's top level: pipeline-wide switches, connectors, stages, platform overlays, gateway.

Build it with ``voxstage.config.load_deploy_config`` (a file) or ``parse_deploy_config`` (a mapping): they
also validate every platform overlay, apply the active one and ``--set`` overrides, and report problems
with file, key path and line. ``DeployConfig.model_validate`` alone checks a single already-merged mapping.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, PrivateAttr, field_validator, model_validator

from voxstage.config.base import StrictModel
from voxstage.config.checks import check_deploy
from voxstage.config.connector import ChunkPlan, ConnectorConfig, ConnectorExtra
from voxstage.config.errors import ConfigError, Issue
from voxstage.config.stage import CODEC_STAGE_ID, TALKER_STAGE_ID, StageConfig

PlatformName = Literal["cuda", "cpu", "rocm", "npu", "xpu", "musa"]
PLATFORMS: tuple[str, ...] = ("cuda", "cpu", "rocm", "npu", "xpu", "musa")
PipelineName = Literal["qwen3_tts", "audio8_tts", "personaplex"]
# HF model_type spellings that name the same family as a pipeline key.
_PIPELINE_ALIASES = {"arktts": "audio8_tts"}
SessionMode = Literal["turn", "duplex"]


class DuplexSessionConfig(StrictModel):
    """Full-duplex sessions (``session_mode: duplex`` only): the gateway's admission cap and the codec's
    per-session jitter buffer."""

    max_sessions: int = Field(default=1, ge=1)
    # User audio the codec buffers per session ahead of its 80 ms ticks (and grants the gateway as credit).
    jitter_buffer_s: float = Field(default=1.0, ge=0.08, le=10.0)


class GatewayConfig(StrictModel):
    """The public face: listen addresses, admission limits and timeouts (not in the seeds; ours only)."""

    # All interfaces, because the gateway normally runs in a container whose port is published.
    host: str = Field(default="0.0.0.0", min_length=1)
    grpc_port: int = Field(default=50051, ge=1, le=65535)
    http_port: int = Field(default=8000, ge=1, le=65535)
    max_concurrent_requests: int | None = Field(default=None, ge=1)
    max_queue: int = Field(default=64, ge=0)
    queue_timeout_s: float = Field(default=30.0, gt=0.0)
    max_text_chars: int = Field(default=4096, ge=1)
    # Duplex sessions (session_mode: duplex): closed after this long without client audio, and after this
    # long in all; a session holds a talker slot for its whole life, so neither may be unbounded (a day at
    # most, as for streaming calls below).
    duplex_idle_timeout_s: float = Field(default=30.0, gt=0.0)
    duplex_max_session_s: float = Field(default=3600.0, gt=0.0, le=86400.0)
    # Streaming calls (gRPC StreamingSynthesize; on HTTP, a response the client does not take, and every
    # request): each holds an admission slot and a codec stream until it ends, so a client that sends nothing
    # or takes no audio is ended after the idle timeout, and every call after the lifetime limit; neither may
    # be unbounded, or a few forgotten clients refuse everyone else.
    stream_idle_timeout_s: float = Field(default=30.0, gt=0.0, le=3600.0)
    max_stream_lifetime_s: float = Field(default=3600.0, gt=0.0, le=86400.0)
    # The HTTP face (uvicorn, h11): bounds on how long a connection may hold the server without sending a
    # whole request (slow headers, a body that stalls behind its Content-Length), on the size of the request
    # line plus headers, and on how long an idle keep-alive connection stays open.
    http_header_timeout_s: float = Field(default=10.0, gt=0.0, le=300.0)
    http_max_header_bytes: int = Field(default=16384, ge=1024, le=1048576)
    http_body_timeout_s: float = Field(default=10.0, gt=0.0, le=300.0)
    http_keep_alive_timeout_s: int = Field(default=5, ge=1, le=300)
    # Security (off by default for local use): API keys from a file (one a line, ``#`` comments) and/or an
    # environment variable (comma-separated); TLS on both public ports from a PEM certificate and key; gRPC
    # reflection and ``/metrics`` on the public ports. See docs/api.md, "Authentication and TLS".
    api_keys_file: str | None = Field(default=None, min_length=1)
    api_keys_env: str | None = Field(default=None, min_length=1, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    tls_cert_file: str | None = Field(default=None, min_length=1)
    tls_key_file: str | None = Field(default=None, min_length=1)
    reflection: bool = True
    public_metrics: bool = True

    @model_validator(mode="after")
    def _distinct_ports(self) -> GatewayConfig:
        if self.grpc_port == self.http_port:
            raise ValueError(f"grpc_port and http_port must differ (both are {self.grpc_port})")
        return self

    @model_validator(mode="after")
    def _tls_pair(self) -> GatewayConfig:
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            have, missing = ("tls_cert_file", "tls_key_file")
            if self.tls_cert_file is None:
                have, missing = missing, have
            raise ValueError(f"gateway.{have} is set but gateway.{missing} is not: TLS needs both PEM files")
        return self

    @property
    def api_keys_configured(self) -> bool:
        return self.api_keys_file is not None or self.api_keys_env is not None

    @property
    def tls(self) -> bool:
        return self.tls_cert_file is not None and self.tls_key_file is not None


class DeployConfig(StrictModel):
    """A validated deploy file (after the active platform overlay and ``--set`` overrides)."""

    model: str | None = Field(default=None, min_length=1)
    pipeline: PipelineName | None = None
    async_chunk: bool = True
    enable_chunked_prefill: bool = True
    session_mode: SessionMode = "turn"
    duplex_session: DuplexSessionConfig | None = None
    connectors: dict[str, ConnectorConfig] = Field(default_factory=dict)
    stages: list[StageConfig] = Field(min_length=1)
    platforms: dict[PlatformName, dict[str, Any]] = Field(default_factory=dict)
    gateway: GatewayConfig = Field(default_factory=GatewayConfig)

    _source: str = PrivateAttr(default="<config>")
    _platform: str | None = PrivateAttr(default=None)
    _overrides: tuple[str, ...] = PrivateAttr(default=())
    _warnings: tuple[Issue, ...] = PrivateAttr(default=())

    @field_validator("pipeline", mode="before")
    @classmethod
    def _alias(cls, value: Any) -> Any:
        return _PIPELINE_ALIASES.get(value, value) if isinstance(value, str) else value

    @model_validator(mode="after")
    def _cross_checks(self) -> DeployConfig:
        findings = check_deploy(self)
        errors = [f for f in findings if f.severity == "error"]
        if errors:
            # Not a ValueError on purpose: it leaves pydantic with its locations intact (see ConfigError).
            raise ConfigError(errors)
        self._warnings = tuple(f for f in findings if f.severity == "warning")
        return self

    # -- provenance, set by the loader --------------------------------------------------------------------

    @property
    def source(self) -> str:
        return self._source

    @property
    def platform(self) -> str | None:
        """The platform whose overlay was applied (None when built without the loader)."""
        return self._platform

    @property
    def overrides(self) -> tuple[str, ...]:
        return self._overrides

    @property
    def warnings(self) -> tuple[Issue, ...]:
        """Valid settings that have no effect in this deploy, each naming its key."""
        return self._warnings

    # -- the stage graph ----------------------------------------------------------------------------------

    def stage(self, stage_id: int) -> StageConfig:
        for stage in self.stages:
            if stage.stage_id == stage_id:
                return stage
        raise KeyError(f"{self._source}: no stage with stage_id {stage_id}")

    @property
    def talker(self) -> StageConfig:
        return self.stage(TALKER_STAGE_ID)

    @property
    def codec(self) -> StageConfig:
        return self.stage(CODEC_STAGE_ID)

    @property
    def stream_connector_name(self) -> str | None:
        """The connector on the talker -> codec edge, or None when the edge declares none (plain gRPC)."""
        for stage in self.stages:
            if stage.stage_id == TALKER_STAGE_ID:
                return stage.output_connectors.get(f"to_stage_{CODEC_STAGE_ID}")
        return None

    @property
    def stream_connector(self) -> ConnectorConfig | None:
        name = self.stream_connector_name
        return self.connectors.get(name) if name is not None else None

    @property
    def stream(self) -> ConnectorExtra:
        """Settings of the talker -> codec stream; defaults when the edge has no connector."""
        connector = self.stream_connector
        return connector.extra if connector is not None else ConnectorExtra()

    @property
    def shared_memory(self) -> bool:
        """Whether the stream may use the same-host shared-memory fast path."""
        connector = self.stream_connector
        return connector is not None and connector.uses_shared_memory

    @property
    def chunk_plan(self) -> ChunkPlan:
        return ChunkPlan.from_extra(self.stream, whole_take=not self.async_chunk)

    # -- gateway-facing limits ----------------------------------------------------------------------------

    @property
    def duplex_max_sessions(self) -> int | None:
        """Cap on live duplex sessions; None in turn mode."""
        if self.session_mode != "duplex":
            return None
        return (self.duplex_session or DuplexSessionConfig()).max_sessions

    @property
    def admission_limit(self) -> int:
        """Requests the gateway runs at once: ``gateway.max_concurrent_requests``, else the smaller of the
        talker's slots and the codec's streams (each request holds one of each)."""
        if self.gateway.max_concurrent_requests is not None:
            return self.gateway.max_concurrent_requests
        return min(self.talker.max_num_seqs, self.codec.max_num_seqs)

    def model_path(self) -> Path | None:
        """``model`` as a directory, or None when it is unset or a preset name.

        A value containing ``/`` or starting with ``.`` or ``~`` is a path; relative paths resolve against the
        deploy file's folder so a deploy folder stays self-contained. Anything else is a preset name.
        """
        if self.model is None or not (("/" in self.model) or self.model.startswith((".", "~"))):
            return None
        path = Path(self.model).expanduser()
        if not path.is_absolute() and self._source != "<config>":
            path = Path(self._source).parent / path
        return path

    # -- rendering ----------------------------------------------------------------------------------------

    def describe(self) -> str:
        from voxstage.config.describe import describe

        return describe(self)

    def summary(self) -> str:
        from voxstage.config.describe import summary

        return summary(self)
