"""OpenAI's voice names as aliases of the served model's own voices, resolved in one place for every face
(HTTP, gRPC, the Realtime WebSocket and ``Converse``).

An OpenAI client sends ``voice="alloy"`` whatever model is behind the URL; the family's descriptor
(``voxstage.families``, ``Family.voice_aliases``) maps each such name to a voice of the family. The deploy
file's ``gateway.voice_aliases`` replaces the family's table (``{}`` turns aliases off). A real voice of the
model always wins over an alias of the same name. An alias whose target the model lacks is refused naming
the field and the table it came from, and the gateway logs every such alias once it learns the model's
voices. docs/api.md's "Voice aliases" table is checked against
``DEFAULT_ALIASES`` by tests/unit/gateway/test_voice_aliases.py.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from gateway.catalog import ModelInfo
from gateway.errors import not_found
from voxstage import families

log = logging.getLogger(__name__)

# The names OpenAI's speech and Realtime APIs accept (openai 2.x/3.x ``SpeechCreateParams.voice``).
OPENAI_VOICES: tuple[str, ...] = (
    "alloy", "ash", "ballad", "cedar", "coral", "echo", "fable", "marin", "nova", "onyx", "sage", "shimmer",
    "verse",
)  # fmt: skip

# Per family (its descriptor's table), by the voices' character.
DEFAULT_ALIASES: dict[str, dict[str, str]] = {f.name: dict(f.voice_aliases) for f in families.families()}
CONFIG_KEY = "gateway.voice_aliases"


def aliases_for(family: str, configured: Mapping[str, str] | None) -> tuple[Mapping[str, str], str]:
    """The alias table in force for ``family`` and where it comes from (for error messages)."""
    if configured is not None:
        return configured, CONFIG_KEY
    return DEFAULT_ALIASES.get(family, {}), "the built-in table"


def resolve_alias(name: str, model: ModelInfo, configured: Mapping[str, str] | None, field: str) -> str:
    """``name`` itself when it is a voice of the model, or no alias, or the model has no voice list here
    (unknown, or none: the caller's own checks answer those); else the voice it is an alias of. Raises
    NOT_FOUND naming ``field`` when the alias points at a voice the model lacks."""
    if not name or not model.voices or model.find_voice(name) is not None:
        return name
    table, source = aliases_for(model.family, configured)
    target = table.get(name.lower())
    if target is None:
        return name
    found = model.find_voice(target)
    if found is None:
        known = ", ".join(v.name for v in model.voices)
        raise not_found(
            field,
            f"voice {name!r} is an alias ({source}) of {target!r}, which model {model.name!r} does not have; "
            f"known: {known}",
            reason="voice_not_found",
        )
    return found.name


def broken_aliases(model: ModelInfo, configured: Mapping[str, str] | None) -> list[str]:
    """``alias -> target`` for each alias whose target the model lacks (empty while voices are unknown)."""
    if not model.voices:
        return []
    table, _ = aliases_for(model.family, configured)
    return [f"{alias} -> {target}" for alias, target in table.items() if model.find_voice(target) is None]


def log_broken_aliases(model: ModelInfo, configured: Mapping[str, str] | None) -> None:
    broken = broken_aliases(model, configured)
    if broken:
        _, source = aliases_for(model.family, configured)
        log.error(
            "voice aliases (%s) name voices model %s does not have; requests using them get NOT_FOUND: %s",
            source, model.name, ", ".join(broken),
        )  # fmt: skip
