"""Loading a deploy file: YAML -> active platform overlay -> ``--set`` overrides -> validation.

Every platform overlay in the file is validated, not only the active one, so a typo in ``platforms.npu`` fails
on a CUDA box too instead of waiting for the first NPU deploy.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from voxstage.config.deploy import PLATFORMS, DeployConfig
from voxstage.config.errors import ConfigError, Issue, dedupe, issues_from_validation_error
from voxstage.config.merge import Origins, Override, apply_overlay, apply_override
from voxstage.config.yaml_source import YamlDocument, read_yaml_file


def detect_platform() -> str:
    """``cuda`` when an NVIDIA GPU is visible to this process, else ``cpu``.

    Importing torch costs seconds, too much for ``validate-config``; torch is asked only if something
    already imported it, otherwise the driver's device list and ``CUDA_VISIBLE_DEVICES`` decide.
    """
    torch = sys.modules.get("torch")
    if torch is not None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() in ("", "-1"):
        return "cpu"
    gpus = Path("/proc/driver/nvidia/gpus")
    try:
        return "cuda" if gpus.is_dir() and any(gpus.iterdir()) else "cpu"
    except OSError:
        return "cpu"


def _locate(issue: Issue, origins: Origins, doc: YamlDocument, hint: str | None) -> Issue:
    """Point ``issue`` (a location in the merged mapping) at the place in the source that wrote the value."""
    loc = issue.loc
    for n in range(len(loc), 0, -1):
        origin = origins.get(loc[:n])
        if origin is None:
            continue
        if origin.doc_loc is not None:
            moved = (*origin.doc_loc, *loc[n:])
            return issue.at(loc=moved, source=doc.source, line=doc.line_of(moved))
        return issue.at(source=doc.source, hint=origin.label)
    return issue.at(source=doc.source, line=doc.line_of(loc) if loc else None, hint=hint)


def _validate(
    merged: dict[str, Any], origins: Origins, doc: YamlDocument, hint: str | None, platform: str
) -> tuple[DeployConfig | None, list[Issue]]:
    try:
        # The platform reaches the cross-key checks: some (the GPU memory budget) depend on it.
        config = DeployConfig.model_validate(merged, context={"platform": platform})
    except ValidationError as exc:
        found = issues_from_validation_error(exc, DeployConfig)
        return None, [_locate(issue, origins, doc, hint) for issue in found]
    except ConfigError as exc:
        return None, [_locate(issue, origins, doc, hint) for issue in exc.issues]
    return config, [_locate(issue, origins, doc, hint) for issue in config.warnings]


def _build(doc: YamlDocument, platform: str | None, overrides: tuple[str, ...]) -> DeployConfig:
    source = doc.source
    chosen = platform or detect_platform()
    if chosen not in PLATFORMS:
        raise ConfigError(
            [
                Issue(
                    loc=(),
                    message=f"unknown platform {chosen!r}; known: {', '.join(PLATFORMS)}",
                    source=source,
                )
            ]
        )
    data = doc.data
    if data is None:
        raise ConfigError(
            [Issue(loc=(), message="the file is empty; a deploy file needs at least `stages`", source=source)]
        )
    if not isinstance(data, dict):
        kind = "a list" if isinstance(data, list) else repr(data)
        raise ConfigError(
            [
                Issue(
                    loc=(),
                    message=f"the top level must be a mapping of keys, got {kind}",
                    source=source,
                    line=1,
                )
            ]
        )

    issues: list[Issue] = []
    merged, origins, overlay_issues = apply_overlay(data, chosen)
    issues += [i.at(source=source, line=doc.line_of(i.loc)) for i in overlay_issues]
    for text in overrides:
        try:
            override = Override.parse(text)
        except ValueError as exc:
            issues.append(Issue(loc=(), message=f"--set {text!r}: {exc}", source=source))
            continue
        problem = apply_override(merged, override, origins)
        if problem is not None:
            issues.append(Issue(loc=(), message=f"--set {text!r}: {problem}", source=source))
    config, found = _validate(merged, origins, doc, hint=None, platform=chosen)
    issues += found

    others = data.get("platforms")
    for name in others if isinstance(others, dict) else ():
        if name == chosen or not isinstance(name, str):
            continue
        merged_other, origins_other, overlay_other = apply_overlay(data, name)
        issues += [i.at(source=source, line=doc.line_of(i.loc)) for i in overlay_other]
        _, found_other = _validate(
            merged_other, origins_other, doc, hint=f"with platforms.{name} applied", platform=name
        )
        # Warnings belong to the platform actually loaded; other overlays only contribute errors.
        issues += [i for i in found_other if i.severity == "error"]

    # File order reads best; issues without a line (from --set, or about the whole file) go last.
    issues = sorted(dedupe(issues), key=lambda i: (i.line is None, i.line or 0))
    errors = [i for i in issues if i.severity == "error"]
    if errors or config is None:
        raise ConfigError(errors)
    config._source = source
    config._platform = chosen
    config._overrides = overrides
    config._warnings = tuple(i for i in issues if i.severity == "warning")
    return config


def load_deploy_config(
    path: str | Path, *, platform: str | None = None, overrides: Iterable[str] = ()
) -> DeployConfig:
    """Load and validate a deploy YAML file.

    ``platform`` picks the overlay (default: ``detect_platform()``); ``overrides`` are ``KEY=VALUE`` strings
    as given to ``--set`` and are applied last. Raises ``ConfigError`` listing every problem.
    """
    return _build(read_yaml_file(Path(path)), platform, tuple(overrides))


def parse_deploy_config(
    data: Any, *, source: str = "<config>", platform: str | None = None, overrides: Iterable[str] = ()
) -> DeployConfig:
    """Like ``load_deploy_config`` for an already-parsed mapping (no line numbers in messages)."""
    return _build(YamlDocument(data=data, root=None, source=source), platform, tuple(overrides))
