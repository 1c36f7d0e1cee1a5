"""Config problems as data: one ``Issue`` per problem, one ``ConfigError`` carrying all of them.

Operators fix a deploy file in one pass only if every problem is reported at once, each naming the file,
the key path and (when known) the line; pydantic's own tracebacks name neither the file nor the line,
so its errors are translated here and never reach the user as-is.
"""

from __future__ import annotations

import difflib
import types
import typing
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from pydantic import BaseModel, ValidationError

Loc = tuple[str | int, ...]
Severity = Literal["error", "warning"]


def render_loc(loc: Loc) -> str:
    """``("stages", 0, "max_num_seqs")`` -> ``stages[0].max_num_seqs``."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


@dataclass(frozen=True)
class Issue:
    """One problem (or warning) in a deploy config, located by key path in its source."""

    loc: Loc
    message: str
    source: str = "<config>"
    line: int | None = None
    # Where the offending value came from when it was not the base file (a --set, a platform overlay).
    hint: str | None = None
    severity: Severity = "error"

    @property
    def path(self) -> str:
        return render_loc(self.loc)

    def __str__(self) -> str:
        head = f"{self.source}: {self.path}: " if self.loc else f"{self.source}: "
        if self.severity == "warning":
            head += "warning: "
        tail = "".join(
            f" ({note})" for note in (self.hint, f"line {self.line}" if self.line else None) if note
        )
        return head + self.message + tail

    def at(self, **changes: Any) -> Issue:
        return replace(self, **changes)


class ConfigError(Exception):
    """A deploy config is invalid; ``issues`` lists every problem found.

    Deliberately not a ``ValueError``: pydantic would swallow a ``ValueError`` raised from a validator and
    re-wrap it without its structured locations.
    """

    def __init__(self, issues: Sequence[Issue]) -> None:
        if not issues:
            raise ValueError("ConfigError needs at least one issue")
        self.issues: tuple[Issue, ...] = tuple(issues)
        super().__init__("\n".join(str(issue) for issue in self.issues))


def _short(value: Any) -> str:
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list | tuple):
        return "a list"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _unwrap(annotation: Any) -> list[Any]:
    """The candidate types of an annotation once ``X | None`` is peeled."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return [arg for arg in typing.get_args(annotation) if arg is not type(None)]
    return [annotation]


def model_at(root: type[BaseModel], loc: Loc) -> type[BaseModel] | None:
    """The pydantic model class that validates the mapping found at ``loc`` (None if not a model)."""
    current: Any = root
    i = 0
    while i < len(loc):
        if not (isinstance(current, type) and issubclass(current, BaseModel)):
            return None
        field = current.model_fields.get(str(loc[i]))
        if field is None:
            return None
        i += 1
        candidates = _unwrap(field.annotation)
        current = candidates[0] if len(candidates) == 1 else None
        # Containers consume one more location element (the list index or the mapping key).
        while typing.get_origin(current) in (list, dict) and i < len(loc):
            args = typing.get_args(current)
            current = args[-1]
            i += 1
            candidates = _unwrap(current)
            current = candidates[0] if len(candidates) == 1 else None
    return current if isinstance(current, type) and issubclass(current, BaseModel) else None


def _unknown_key_message(root: type[BaseModel], loc: Loc) -> str:
    owner = model_at(root, loc[:-1])
    if owner is None:
        return "unknown key"
    allowed = sorted(owner.model_fields)
    close = difflib.get_close_matches(str(loc[-1]), allowed, n=1)
    if close:
        return f"unknown key (did you mean '{close[0]}'?)"
    return "unknown key; allowed keys here: " + ", ".join(allowed)


def issues_from_validation_error(exc: ValidationError, root: type[BaseModel]) -> list[Issue]:
    """Translate pydantic's errors into ``Issue``s with plain messages (locations are kept as-is)."""
    issues: list[Issue] = []
    for err in exc.errors(include_url=False):
        loc: Loc = tuple(err["loc"])
        kind = err["type"]
        msg = err["msg"]
        if kind == "extra_forbidden":
            message = _unknown_key_message(root, loc)
        elif kind == "missing":
            message = "required key is missing"
        elif loc and loc[-1] == "[key]":
            loc = loc[:-1]
            message = f"invalid key: {msg}"
        elif kind in ("value_error", "assertion_error"):
            message = msg.removeprefix("Value error, ").removeprefix("Assertion failed, ")
        else:
            message = f"{msg}, got {_short(err.get('input'))}" if "input" in err else msg
        issues.append(Issue(loc=loc, message=message))
    return issues


def dedupe(issues: Iterable[Issue]) -> list[Issue]:
    """Drop repeats (same severity, place and message) while keeping first-seen order."""
    seen: set[tuple[str, str, str]] = set()
    out: list[Issue] = []
    for issue in issues:
        key = (issue.severity, issue.path, issue.message)
        if key not in seen:
            seen.add(key)
            out.append(issue)
    return out
