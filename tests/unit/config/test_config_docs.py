"""docs/configuration.md documents every key of the seed files and every field of the schema."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel

from voxstage.config import (
    ConnectorConfig,
    ConnectorExtra,
    DeployConfig,
    DuplexSessionConfig,
    GatewayConfig,
    SamplingParams,
    SegmentsConfig,
    StageConfig,
)

REPO = Path(__file__).resolve().parents[3]
DOC = (REPO / "docs" / "configuration.md").read_text()
# Keys named in the first column of a table row; a dotted row such as "| `extra.codec_chunk_frames` |"
# documents both parts, and placeholders such as `<name>` are not keys.
TABLE_KEYS = {
    part.split("[")[0]
    for match in re.findall(r"^\| `([^`]+)`", DOC, flags=re.MULTILINE)
    for part in match.split(".")
    if not part.startswith("<")
}


def _leaf_keys(node: Any, skip_values_of: frozenset[str] = frozenset()) -> set[str]:
    """Every mapping key in ``node``; the keys inside ``skip_values_of`` are user-chosen names, not schema."""
    keys: set[str] = set()
    if isinstance(node, dict):
        for key, value in node.items():
            keys.add(str(key))
            if key in skip_values_of:
                for inner in value.values():
                    keys |= _leaf_keys(inner, skip_values_of)
            else:
                keys |= _leaf_keys(value, skip_values_of)
    elif isinstance(node, list):
        for item in node:
            keys |= _leaf_keys(item, skip_values_of)
    return keys


def test_every_seed_key_has_a_table_row() -> None:
    # Connector names, platform names and edge keys are names the file chooses, documented as patterns.
    named = frozenset({"connectors", "platforms", "input_connectors", "output_connectors"})
    seen: set[str] = set()
    for name in ("qwen3_tts", "audio8_tts", "personaplex"):
        seen |= _leaf_keys(yaml.safe_load((REPO / "deploy" / f"{name}.yaml").read_text()), named)
    missing = sorted(seen - TABLE_KEYS)
    assert not missing, f"seed keys without a row in docs/configuration.md: {missing}"


def test_every_schema_field_has_a_table_row() -> None:
    models: list[type[BaseModel]] = [
        DeployConfig,
        ConnectorConfig,
        ConnectorExtra,
        StageConfig,
        SamplingParams,
        SegmentsConfig,
        DuplexSessionConfig,
        GatewayConfig,
    ]
    fields = {name for model in models for name in model.model_fields}
    missing = sorted(fields - TABLE_KEYS)
    assert not missing, f"schema fields without a row in docs/configuration.md: {missing}"
