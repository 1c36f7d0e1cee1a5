"""The registry of model families: one line per family, naming its descriptor module.

Every place that depends on the family reads its descriptor (``Family``) from here: the stages load the
talker and codec it names, ``voxstage.presets`` builds its presets, the config checks and the gateway read
its facts. A new family is a folder per stage, a descriptor module and a line in ``BUILT_IN``;
``VOXSTAGE_FAMILIES`` (comma-separated module names) adds families from outside the package (tests, or a
family kept out of tree) to every process that inherits the variable. No torch, no stage code.
"""

from __future__ import annotations

import functools
import importlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from voxstage.families.descriptor import Bench, Family, Limits, Preset

__all__ = ["Bench", "Family", "Limits", "Preset", "UnknownFamily", "families", "family", "load_ref"]

BUILT_IN: tuple[str, ...] = (
    "voxstage.families.qwen3_tts",
    "voxstage.families.audio8_tts",
    "voxstage.families.personaplex",
)
EXTRA_ENV = "VOXSTAGE_FAMILIES"


class UnknownFamily(ValueError):
    """A name, preset or checkpoint that no registered family claims."""


@functools.cache
def families() -> tuple[Family, ...]:
    """Every registered family, built-in first, then those named in ``VOXSTAGE_FAMILIES``."""
    extra = [m.strip() for m in os.environ.get(EXTRA_ENV, "").split(",") if m.strip()]
    found: list[Family] = []
    for module in (*BUILT_IN, *extra):
        descriptor = getattr(importlib.import_module(module), "FAMILY", None)
        if not isinstance(descriptor, Family):
            raise UnknownFamily(f"{module}: defines no FAMILY = Family(...) ({EXTRA_ENV} names it)")
        taken = {n for f in found for n in f.names}
        if taken & set(descriptor.names):
            raise UnknownFamily(f"{module}: family name {descriptor.name!r} is registered twice")
        found.append(descriptor)
    return tuple(found)


def family(name: str) -> Family:
    """The family called ``name`` (its code name or an alias)."""
    for f in families():
        if name in f.names:
            return f
    known = ", ".join(f.name for f in families())
    raise UnknownFamily(f"model family {name!r} is not served by voxstage (families: {known})")


def find(name: str) -> Family | None:
    try:
        return family(name)
    except UnknownFamily:
        return None


def preset(name: str) -> tuple[Family, Preset] | None:
    """The family and preset of a built-in model name, or None."""
    for f in families():
        if (p := f.preset(name)) is not None:
            return f, p
    return None


def preset_names() -> tuple[str, ...]:
    return tuple(p.name for f in families() for p in f.presets)


def detect(directory: Path, config: dict[str, Any] | None) -> Family:
    """The family of a checkpoint directory, from its ``config.json`` (``config``; None when absent) or,
    when that names no ``model_type``, from a file only the family's layout has."""
    model_type = None if config is None else config.get("model_type")
    if model_type is None:
        for f in families():
            if f.layout_glob and any(directory.glob(f.layout_glob)):
                return f
    for f in families():
        if model_type in f.model_types:
            return f
    supported = ", ".join(t for f in families() for t in f.model_types)
    raise UnknownFamily(
        f"{directory / 'config.json'}: model_type {model_type!r} is not served by voxstage "
        f"(supported: {supported})"
    )


def default_family() -> Family:
    """The family ``voxstage demo`` and the benchmarks' stacks run by default: the first that names a demo."""
    return next(f for f in families() if f.demo is not None)


def load_ref(ref: str) -> Callable[..., Any]:
    """The callable a descriptor names as ``"module:attribute"`` (imported on first use)."""
    module, _, attribute = ref.partition(":")
    target = getattr(importlib.import_module(module), attribute, None)
    if not callable(target):
        raise UnknownFamily(f"{ref}: not a callable")
    return target
