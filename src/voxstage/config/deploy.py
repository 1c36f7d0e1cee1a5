"""The deploy file's top level: pipeline-wide switches, connectors, stages, platform overlays, gateway.

Build it with ``voxstage.config.load_deploy_config`` (a file) or ``parse_deploy_config`` (a mapping): they
also validate every platform overlay, apply the active one and ``--set`` overrides, and report problems
with file, key path and line. ``DeployConfig.model_validate`` alone checks a single already-merged mapping.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, PrivateAttr, ValidationInfo, field_validator, model_validator

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
    # StreamingSynthesize: "sentence" also flushes wherever a sentence ends in the client's deltas
    # (voxstage.segments.SentenceFlusher); "off" leaves segment boundaries to the client's flushes.
    auto_flush: Literal["off", "sentence"] = "off"
    # Voice names (OpenAI's, or any) standing for voices of the served model: alias -> voice. Unset: the
    # family's built-in table (gateway/voice_aliases.py); {} turns aliases off. Targets are checked against
    # the model's voices once the gateway knows them (a missing one is logged, and refused per request).
    voice_aliases: dict[str, str] | None = None
    # Duplex sessions (session_mode: duplex): closed after this long without client audio, and after this
    # long in all; a session holds a talker slot for its whole life, so neither may be unbounded (a day at
    # most, as for streaming calls below).
    duplex_idle_timeout_s: float = Field(default=30.0, gt=0.0)
    duplex_max_session_s: float = Field(default=3600.0, gt=0.0, le=86400.0)
    # A client that keeps its connection but stops reading parks the session's agent audio in its face's
    # write; beyond this the gateway ends the session and frees its slots instead of waiting for a disconnect.
    duplex_send_timeout_s: float = Field(default=10.0, gt=0.0, le=300.0)
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
    # Mutual TLS on the gateway's links to the stages (off by default: a private network). The stages take
    # the same files as ``--link-*`` flags; ``voxstage serve`` passes one set to every process.
    link_ca_file: str | None = Field(default=None, min_length=1)
    link_cert_file: str | None = Field(default=None, min_length=1)
    link_key_file: str | None = Field(default=None, min_length=1)
    link_server_name: str | None = Field(default=None, min_length=1)
    # Where the stages are (``voxstage gateway`` without --codec/--talker reads these): host:port entries,
    # a name standing for every address it resolves to (gateway/discovery.py). ``voxstage serve`` passes
    # the addresses of the stages it starts instead.
    codec_addresses: list[str] | None = Field(default=None, min_length=1)
    talker_addresses: list[str] | None = Field(default=None, min_length=1)
    # How often names among those addresses are resolved again (also at once on failure); DNS TTLs of
    # headless Services are seconds to tens of seconds, and a lookup is cheap.
    discovery_interval_s: float = Field(default=5.0, gt=0.0, le=3600.0)

    @field_validator("codec_addresses", "talker_addresses", mode="before")
    @classmethod
    def _address_list(cls, value: Any) -> Any:
        # `--set gateway.talker_addresses=a:1,b:2` arrives as one string; a YAML list is the file's form.
        return [part.strip() for part in value.split(",")] if isinstance(value, str) else value

    @field_validator("codec_addresses", "talker_addresses")
    @classmethod
    def _host_ports(cls, value: list[str] | None) -> list[str] | None:
        if value is not None:
            from voxstage.resolver import split_host_port

            for entry in value:
                host, port = split_host_port(entry)  # ValueError names the entry
                if not 0 < port < 65536:
                    raise ValueError(f"{entry!r}: port out of range")
            if len(set(value)) != len(value):
                raise ValueError(f"lists an address twice: {value}")
        return value

    @field_validator("voice_aliases")
    @classmethod
    def _aliases(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        if value is None:
            return None
        table: dict[str, str] = {}
        for alias, target in value.items():
            if not alias.strip() or any(c.isspace() for c in alias):
                raise ValueError(f"alias {alias!r} must be a non-empty name without spaces")
            if not target.strip():
                raise ValueError(f"alias {alias!r} needs a target voice, got {target!r}")
            if alias.lower() in table:
                raise ValueError(f"alias {alias!r} is listed twice (names match without regard to case)")
            table[alias.lower()] = target.strip()  # voices are matched without regard to case too
        return table

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

    @model_validator(mode="after")
    def _link_set(self) -> GatewayConfig:
        files = {"link_ca_file": self.link_ca_file, "link_cert_file": self.link_cert_file,
                 "link_key_file": self.link_key_file}  # fmt: skip
        missing = [f"gateway.{name}" for name, value in files.items() if value is None]
        if len(missing) == len(files):
            if self.link_server_name is not None:
                raise ValueError(
                    "gateway.link_server_name is set but mTLS on the stage links is off: it also needs "
                    "gateway.link_ca_file, gateway.link_cert_file and gateway.link_key_file"
                )
        elif missing:
            raise ValueError(
                f"{', '.join(missing)} not set: mTLS on the stage links needs gateway.link_ca_file, "
                "gateway.link_cert_file and gateway.link_key_file together"
            )
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
    def _cross_checks(self, info: ValidationInfo) -> DeployConfig:
        platform = info.context.get("platform") if isinstance(info.context, dict) else None
        findings = check_deploy(self, platform=platform)
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
        talkers' slots and the codecs' streams over this file's replicas (each request holds one of each).
        Replicas found by discovery beyond those are not counted: set the key when the fleet is larger."""
        if self.gateway.max_concurrent_requests is not None:
            return self.gateway.max_concurrent_requests
        talker, codec = self.talker, self.codec
        return min(talker.max_num_seqs * talker.replica_count, codec.max_num_seqs * codec.replica_count)

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
