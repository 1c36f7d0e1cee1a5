"""Platform overlays and ``--set`` overrides, applied to the raw mapping with a record of each value's origin.

Overlaid and overridden values are validated by the same models as the base file, after merging; the record
(``Origins``) lets an error in a merged value be reported at the overlay line that wrote it, or against the
``--set`` that supplied it, instead of at a base-file path that never contained the bad value.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import yaml

from voxstage.config.errors import Issue, Loc


@dataclass(frozen=True)
class Origin:
    """Where a merged value was written: a document path (overlay) or a label (``--set``)."""

    doc_loc: Loc | None = None
    label: str | None = None


Origins = dict[Loc, Origin]


def _merge_into(
    parent: dict[str, Any], key: str, value: Any, loc: Loc, doc_loc: Loc, origins: Origins
) -> None:
    # Mappings merge key by key so an overlay can change one sampling parameter without restating the rest;
    # anything else (scalars, lists such as capture sizes) is replaced whole.
    current = parent.get(key)
    if isinstance(value, dict) and isinstance(current, dict):
        for sub_key, sub_value in value.items():
            _merge_into(current, sub_key, sub_value, (*loc, sub_key), (*doc_loc, sub_key), origins)
        return
    parent[key] = copy.deepcopy(value)
    origins[loc] = Origin(doc_loc=doc_loc)


def _merge_stages(merged: dict[str, Any], overlay_stages: Any, root: Loc, origins: Origins) -> list[Issue]:
    if not isinstance(overlay_stages, list):
        return [
            Issue(loc=(*root, "stages"), message="must be a list of stage overrides, each with a stage_id")
        ]
    base = merged.get("stages")
    if not isinstance(base, list):
        return []  # the base file's own validation reports a malformed stages list
    by_id = {
        stage["stage_id"]: i
        for i, stage in enumerate(base)
        if isinstance(stage, dict) and isinstance(stage.get("stage_id"), int)
    }
    issues: list[Issue] = []
    for j, item in enumerate(overlay_stages):
        here = (*root, "stages", j)
        if not isinstance(item, dict):
            issues.append(Issue(loc=here, message="must be a mapping with a stage_id"))
            continue
        stage_id = item.get("stage_id")
        if not isinstance(stage_id, int) or isinstance(stage_id, bool):
            issues.append(
                Issue(
                    loc=(*here, "stage_id"),
                    message="required: the integer stage_id of the base stage to change",
                )
            )
            continue
        if stage_id not in by_id:
            issues.append(
                Issue(
                    loc=(*here, "stage_id"),
                    message=f"no stage with stage_id {stage_id} in the base file; an overlay only "
                    "changes existing stages",
                )
            )
            continue
        i = by_id[stage_id]
        for key, value in item.items():
            if key != "stage_id":
                _merge_into(base[i], key, value, ("stages", i, key), (*here, key), origins)
    return issues


def apply_overlay(data: dict[str, Any], platform: str) -> tuple[dict[str, Any], Origins, list[Issue]]:
    """``data`` with ``platforms.<platform>`` merged over it (stages matched by ``stage_id``)."""
    merged = copy.deepcopy(data)
    origins: Origins = {}
    overlays = data.get("platforms")
    if not isinstance(overlays, dict) or not isinstance(overlays.get(platform), dict):
        return merged, origins, []  # absent, or malformed and reported by validation of `platforms`
    root: Loc = ("platforms", platform)
    issues: list[Issue] = []
    for key, value in overlays[platform].items():
        if key == "platforms":
            issues.append(Issue(loc=(*root, key), message="an overlay cannot contain platforms"))
        elif key == "stages":
            issues.extend(_merge_stages(merged, value, root, origins))
        else:
            _merge_into(merged, key, value, (key,), (*root, key), origins)
    return merged, origins, issues


@dataclass(frozen=True)
class Override:
    """One ``--set KEY=VALUE``: a dotted key path and a YAML-typed value."""

    text: str
    path: tuple[str, ...]
    value: Any

    @classmethod
    def parse(cls, text: str) -> Override:
        """Raises ``ValueError`` with a message meant for the user."""
        key, sep, raw = text.partition("=")
        path = tuple(part.strip() for part in key.split("."))
        if not sep or not key.strip() or any(not part for part in path):
            raise ValueError("expected KEY=VALUE with a dotted key, e.g. stages.0.max_num_seqs=4")
        try:
            value = yaml.safe_load(raw)
        except yaml.YAMLError as exc:
            raise ValueError(f"value is not valid YAML: {exc}") from None
        return cls(text=text, path=path, value=value)


def _child_index(container: list[Any], part: str, in_stages: bool) -> int | str:
    """The list index ``part`` selects, or an error message."""
    if not part.lstrip("-").isdigit():
        return (
            "stages are addressed by stage_id: stages.<id>.<key>"
            if in_stages
            else f"{part!r} is not a list index"
        )
    number = int(part)
    if in_stages:
        for i, stage in enumerate(container):
            if isinstance(stage, dict) and stage.get("stage_id") == number:
                return i
        return f"no stage with stage_id {number}"
    if not 0 <= number < len(container):
        return f"index {number} is out of range (the list has {len(container)} items)"
    return number


def apply_override(data: dict[str, Any], override: Override, origins: Origins) -> str | None:
    """Set ``override`` in ``data`` in place; returns an error message instead when the path cannot exist."""
    if override.path[0] == "platforms":
        return "cannot edit platforms: overrides apply to the effective config, after the platform overlay"
    parent: Any = data
    loc: list[str | int] = []
    for depth, part in enumerate(override.path):
        last = depth == len(override.path) - 1
        key: str | int
        if isinstance(parent, list):
            found = _child_index(parent, part, in_stages=loc == ["stages"])
            if isinstance(found, str):
                return found
            key = found
        elif isinstance(parent, dict):
            key = part
            if not last and parent.get(key) is None:
                # A missing section is created so e.g. `gateway.max_queue=8` works without a gateway block.
                parent[key] = {}
        else:
            return f"{'.'.join(override.path[:depth])} holds a single value, not keys"
        loc.append(key)
        if last:
            parent[key] = copy.deepcopy(override.value)
        else:
            parent = parent[key]
    target = tuple(loc)
    for stale in [k for k in origins if k[: len(target)] == target]:
        del origins[stale]
    origins[target] = Origin(label=f"from --set {override.text}")
    return None
