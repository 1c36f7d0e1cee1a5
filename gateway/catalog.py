"""What the deployment serves: model name, family, output rate, voices and languages.

The talker's ``StageStatus`` names the model and family, and the codec's gives the native sample rate, but
no internal message carries a voice list (the protos are frozen for this release). Voices and languages
therefore come from the checkpoint's ``config.json`` when the gateway can read it: a checkpoint directory
on a shared volume (compose mounts the checkpoint volume into the gateway read-only) or a preset in
``$VOXSTAGE_CACHE`` (``voxstage serve`` shares it). Reading JSON is all it does; the gateway never imports
model code. PersonaPlex's stored voices are the names of its ``voices/*.pt`` files (or ``voices.tgz``
members). When the files are out of reach, the catalog knows the model but not its voices: requests pass
the voice through and the talker judges it, and ``ListVoices`` reports one entry with an empty name.
"""

from __future__ import annotations

import json
import logging
import os
import tarfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from voxstage.internal.v1 import stage_pb2
from voxstage.v1 import speech_pb2

log = logging.getLogger(__name__)

# BCP-47 primary subtags for the language names Qwen3-TTS checkpoints use in ``codec_language_id``.
BCP47_NAMES: dict[str, str] = {
    "en": "english",
    "de": "german",
    "es": "spanish",
    "zh": "chinese",
    "ja": "japanese",
    "fr": "french",
    "ko": "korean",
    "ru": "russian",
    "it": "italian",
    "pt": "portuguese",
}
AUTO_LANGUAGE = "auto"
# Families whose talker only converses (full duplex, docs/protocol.md §11): text-to-speech is refused.
DUPLEX_ONLY_FAMILIES = frozenset({"personaplex"})
# Audio8 (arktts) speaks in its own voice, or clones one from ``ref_audio`` + ``ref_text``; it has no preset
# speakers, no language switch (it reads the text's language) and no instructions.
PLAIN_VOICE = "default"


@dataclass(frozen=True)
class VoiceInfo:
    name: str
    languages: tuple[str, ...]
    description: str = ""


@dataclass(frozen=True)
class ModelInfo:
    name: str
    family: str
    sample_rate_hz: int
    # None: the checkpoint was out of reach, so voices/languages are unknown here (the talker decides).
    voices: tuple[VoiceInfo, ...] | None = None
    languages: tuple[str, ...] | None = None
    # "custom_voice" (preset speakers), "base" (voice clone), "voice_design" (instructions), "plain" (its
    # own voice, voice clone optional: Audio8); None if unknown.
    variant: str | None = None
    aliases: tuple[str, ...] = field(default=())

    @property
    def duplex_only(self) -> bool:
        return self.family in DUPLEX_ONLY_FAMILIES

    @property
    def takes_reference(self) -> bool:
        return self.variant in (None, "base", "plain")

    @property
    def needs_reference(self) -> bool:
        return self.variant == "base"

    @property
    def takes_instructions(self) -> bool:
        return self.variant not in ("base", "plain")

    @property
    def default_voice(self) -> str:
        """The first preset speaker in checkpoint order, or "" when there is none (or it is unknown)."""
        return self.voices[0].name if self.voices else ""

    def find_voice(self, name: str) -> VoiceInfo | None:
        if self.voices is None:
            return None
        wanted = name.lower()
        return next((v for v in self.voices if v.name.lower() == wanted), None)

    def resolve_language(self, tag: str) -> str | None:
        """The checkpoint's name for ``tag`` (a name like ``english`` or a BCP-47 tag like ``en-US``), or
        None if this model does not speak it. Unknown language lists accept everything as given."""
        if self.languages is None:
            return tag
        lowered = tag.strip().lower()
        if lowered == AUTO_LANGUAGE:
            return AUTO_LANGUAGE
        if lowered in self.languages:
            return lowered
        primary = lowered.replace("_", "-").split("-")[0]
        name = BCP47_NAMES.get(primary)
        return name if name in self.languages else None


def cache_dir() -> Path:
    # Mirrors voxstage.presets.cache_dir, which cannot be imported here: that module pulls in torch.
    base = os.environ.get("VOXSTAGE_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "voxstage")
    return Path(base)


def checkpoint(model: str, model_dirs: list[Path] | None = None) -> tuple[Path, dict[str, object]] | None:
    """``model``'s directory and ``config.json``, or None when unreadable.

    Looked up as a directory path, as a preset in the cache, and by its base name under each of
    ``model_dirs`` (where a deployment mounts its checkpoints).
    """
    candidates = [Path(model).expanduser(), cache_dir() / "presets" / model]
    candidates += [base / Path(model).name for base in model_dirs or []]
    for directory in candidates:
        try:
            data = json.loads((directory / "config.json").read_text())
        except (OSError, ValueError):
            continue
        if isinstance(data, dict):
            return directory, data
    return None


def _stored_voices(directory: Path) -> tuple[VoiceInfo, ...] | None:
    """PersonaPlex's stored voices: ``voices/NAME.pt`` files, else the ``.pt`` members of ``voices.tgz``
    (the talker's rule, services/talker/models/personaplex/voices.py); None when the archive is unreadable."""
    folder, archive = directory / "voices", directory / "voices.tgz"
    if folder.is_dir():
        names = [p.stem for p in folder.glob("*.pt")]
    elif archive.is_file():
        try:
            with tarfile.open(archive) as tar:
                names = [
                    PurePosixPath(m.name).stem
                    for m in tar.getmembers()
                    if m.isfile() and m.name.endswith(".pt")
                ]
        except (tarfile.TarError, OSError):
            return None
    else:
        names = []
    return tuple(VoiceInfo(name, (), "stored voice") for name in sorted(names))


def _voices_from_config(config: dict[str, object]) -> tuple[tuple[VoiceInfo, ...], tuple[str, ...], str]:
    talker = config.get("talker_config")
    talker = talker if isinstance(talker, dict) else {}
    raw_langs = talker.get("codec_language_id")
    # Dialects are reached through their speakers, never requested directly (the talker rejects them).
    languages = tuple(
        k.lower() for k in (raw_langs if isinstance(raw_langs, dict) else {}) if "dialect" not in k.lower()
    )
    speakers = talker.get("spk_id")
    dialects = talker.get("spk_is_dialect")
    dialects = dialects if isinstance(dialects, dict) else {}
    voices: list[VoiceInfo] = []
    for name in speakers if isinstance(speakers, dict) else {}:
        dialect = dialects.get(name)
        description = f"preset speaker ({dialect.replace('_', ' ')})" if isinstance(dialect, str) else ""
        voices.append(VoiceInfo(name.lower(), languages, description or "preset speaker"))
    variant = config.get("tts_model_type")
    return tuple(voices), languages, variant if isinstance(variant, str) else ""


def build_model_info(
    talker: stage_pb2.StageStatus,
    codec: stage_pb2.StageStatus | None,
    *,
    model_dirs: list[Path] | None = None,
) -> ModelInfo:
    name = talker.model
    rate = codec.sample_rate_hz if codec is not None and codec.sample_rate_hz else talker.sample_rate_hz
    aliases = tuple({name, Path(name).name} - {""})
    found = checkpoint(name, model_dirs) if name else None
    if found is None:
        log.info("model %r: checkpoint config not readable from the gateway; voices are not listed", name)
        return ModelInfo(
            name=Path(name).name or name, family=talker.family, sample_rate_hz=rate, aliases=aliases
        )
    directory, config = found
    if talker.family in DUPLEX_ONLY_FAMILIES:
        # A conversational model speaks with a stored voice; it has no text-to-speech languages.
        return ModelInfo(
            name=Path(name).name or name,
            family=talker.family,
            sample_rate_hz=rate,
            voices=_stored_voices(directory),
            languages=(),
            aliases=aliases,
        )
    if talker.family == "arktts":
        own = VoiceInfo(PLAIN_VOICE, (), "the model's own voice; send ref_audio and ref_text to clone one")
        return ModelInfo(
            name=Path(name).name or name,
            family=talker.family,
            sample_rate_hz=rate,
            voices=(own,),
            languages=(),
            variant="plain",
            aliases=aliases,
        )
    voices, languages, variant = _voices_from_config(config)
    return ModelInfo(
        name=Path(name).name or name,
        family=talker.family,
        sample_rate_hz=rate,
        voices=voices,
        languages=languages,
        variant=variant or None,
        aliases=aliases,
    )


def voices_of(model: ModelInfo, language: str) -> list[speech_pb2.Voice]:
    """The catalog's voices, filtered by language; one unnamed entry when the voice list is unknown."""
    if model.voices is None:
        return [
            speech_pb2.Voice(
                name="",
                model=model.name,
                native_sample_rate_hz=model.sample_rate_hz,
                description="voice list unavailable: the gateway cannot read this model's checkpoint config",
            )
        ]
    if language and model.resolve_language(language) is None:
        return []
    return [
        speech_pb2.Voice(
            name=v.name,
            model=model.name,
            languages=list(v.languages),
            description=v.description,
            native_sample_rate_hz=model.sample_rate_hz,
        )
        for v in model.voices
    ]
