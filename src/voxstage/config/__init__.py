"""Typed deploy configuration: the seed YAMLs' schema, validation, platform overlays and ``--set`` overrides.

Entry points: ``load_deploy_config(path, platform=..., overrides=...)`` for a file and
``parse_deploy_config`` for a mapping, both returning a ``DeployConfig`` or raising one ``ConfigError`` that
lists every problem. Key-by-key meanings are documented in docs/configuration.md. Human-readable
renderings are ``voxstage.config.describe.describe``/``summary`` (not re-exported here: a package
attribute named ``describe`` would shadow the submodule of the same name).
"""

from voxstage.config.connector import CONNECTOR_KINDS, ChunkPlan, ConnectorConfig, ConnectorExtra
from voxstage.config.deploy import PLATFORMS, DeployConfig
from voxstage.config.duplex import DuplexSessionConfig
from voxstage.config.errors import ConfigError, Issue
from voxstage.config.gateway import GatewayConfig
from voxstage.config.loader import detect_platform, load_deploy_config, parse_deploy_config
from voxstage.config.model_checks import check_codec_against_model, raise_for_errors
from voxstage.config.stage import (
    CODEC_STAGE_ID,
    TALKER_STAGE_ID,
    SamplingParams,
    SegmentsConfig,
    StageConfig,
    StageRole,
)

__all__ = [
    "CODEC_STAGE_ID",
    "CONNECTOR_KINDS",
    "PLATFORMS",
    "TALKER_STAGE_ID",
    "ChunkPlan",
    "ConfigError",
    "ConnectorConfig",
    "ConnectorExtra",
    "DeployConfig",
    "DuplexSessionConfig",
    "GatewayConfig",
    "Issue",
    "SamplingParams",
    "SegmentsConfig",
    "StageConfig",
    "StageRole",
    "check_codec_against_model",
    "detect_platform",
    "load_deploy_config",
    "parse_deploy_config",
    "raise_for_errors",
]
