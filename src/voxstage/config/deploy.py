"""The deploy file's top level: pipeline-wide switches, connectors, stages, platform overlays, gateway.

Build it with ``voxstage.config.load_deploy_config`` (a file) or ``parse_deploy_config`` (a mapping): they
also validate every platform overlay, apply the active one and ``--set`` overrides, and report problems
with file, key path and line. ``DeployConfig.model_validate`` alone checks a single already-merged mapping.

Imports point one way: this module uses checks.py (cross-key checks, typed against a protocol) and
the section modules; describe.py (rendering) uses this one. ``DuplexSessionConfig`` and
``GatewayConfig`` live in duplex.py and gateway.py so checks.py can name them without importing this
module; they remain importable from here (services/codec/main.py imports the former this way).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, PrivateAttr, ValidationInfo, field_validator, model_validator

from voxstage import families
from voxstage.config.base import StrictModel
from voxstage.config.checks import check_deploy
from voxstage.config.connector import ChunkPlan, ConnectorConfig, ConnectorExtra
from voxstage.config.duplex import DuplexSessionConfig
from voxstage.config.errors import ConfigError, Issue
from voxstage.config.gateway import GatewayConfig
from voxstage.config.stage import CODEC_STAGE_ID, TALKER_STAGE_ID, StageConfig

PlatformName = Literal["cuda", "cpu", "rocm", "npu", "xpu", "musa"]
PLATFORMS: tuple[str, ...] = ("cuda", "cpu", "rocm", "npu", "xpu", "musa")
SessionMode = Literal["turn", "duplex"]


class DeployConfig(StrictModel):
    """A validated deploy file (after the active platform overlay and ``--set`` overrides)."""

    model: str | None = Field(default=None, min_length=1)
    pipeline: str | None = None  # a registered family (voxstage.families), by name or alias
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
    def _family(cls, value: Any) -> Any:
        if not isinstance(value, str):
            return value
        fam = families.find(value)
        if fam is None:
            names = [f"'{f.name}'" for f in families.families()]
            listed = names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"
            raise ValueError(f"Input should be {listed}, got {value!r}")
        return fam.name

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
    def duplex(self) -> DuplexSessionConfig:
        """The ``duplex_session`` block, or its defaults where the deploy file omits it."""
        return self.duplex_session or DuplexSessionConfig()

    @property
    def duplex_max_sessions(self) -> int | None:
        """Cap on live duplex sessions; None in turn mode."""
        if self.session_mode != "duplex":
            return None
        return self.duplex.max_sessions

    @property
    def admission_limit(self) -> int:
        """Requests the gateway runs at once: ``gateway.max_concurrent_requests``, else the smaller of the
        talkers' slots and the codecs' streams over this file's replicas (each request holds one of each).
        Replicas found by discovery beyond those are not counted: set the key when the fleet is larger."""
        if self.gateway.max_concurrent_requests is not None:
            return self.gateway.max_concurrent_requests
        talker, codec = self.talker, self.codec
        return min(talker.max_num_seqs * talker.replica_count, codec.max_num_seqs * codec.replica_count)

    @property
    def max_frames_limit(self) -> int | None:
        """The largest ``max_frames`` a request may ask for: ``gateway.max_frames_limit``, else the talker's
        ``default_sampling_params.max_tokens``; None: only the model's window bounds it."""
        if self.gateway.max_frames_limit is not None:
            return self.gateway.max_frames_limit
        return self.talker.default_sampling_params.max_tokens

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
