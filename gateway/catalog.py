"""What the deployment serves: model name, family, output rate, voices, languages and capabilities.

The talker's ``StageStatus`` says it all: the model and its family, and in ``catalog`` the checkpoint's
voices, languages and what a request may or must carry (reference audio, its transcript, instructions, a
voice); the codec's gives the native sample rate. The family's descriptor (``voxstage.families``) adds
what holds for every checkpoint of it: whether it is full duplex, the BCP-47 tags of its language names,
its voice aliases. A talker older than ``catalog`` leaves the voices unknown: requests then pass the voice
through, the talker judges it, and ``ListVoices`` reports one entry with an empty name. The talker's
request limits become the model's ``budget`` (``gateway.text_budget``), checked before a request leaves.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from gateway.text_budget import TextBudget
from voxstage import families
from voxstage.internal.v1 import stage_pb2
from voxstage.v1 import speech_pb2

log = logging.getLogger(__name__)

AUTO_LANGUAGE = "auto"


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
    # None: the talker did not report its voices/languages (an older talker), so they are judged there.
    voices: tuple[VoiceInfo, ...] | None = None
    languages: tuple[str, ...] | None = None
    # The checkpoint's kind within its family (custom_voice, base, voice_design, ...), for messages.
    variant: str | None = None
    aliases: tuple[str, ...] = field(default=())
    duplex_only: bool = False  # full duplex: text-to-speech is refused (docs/protocol.md §11)
    takes_reference: bool = True  # reference audio clones a voice
    needs_reference: bool = False  # every request must carry reference audio
    needs_reference_text: bool = False  # reference audio must come with its transcript
    takes_instructions: bool = True
    # BCP-47 primary subtag -> the checkpoint's language name (the family's descriptor).
    language_tags: Mapping[str, str] = field(default_factory=dict)
    # What one request may hold (the talker's StageStatus); None: the talker judges each request alone.
    budget: TextBudget | None = None

    @property
    def default_voice(self) -> str:
        """The first voice in checkpoint order, or "" when there is none (or it is unknown)."""
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
        name = self.language_tags.get(primary)
        return name if name in self.languages else None


def build_model_info(talker: stage_pb2.StageStatus, codec: stage_pb2.StageStatus | None) -> ModelInfo:
    name = talker.model
    rate = codec.sample_rate_hz if codec is not None and codec.sample_rate_hz else talker.sample_rate_hz
    fam = families.find(talker.family)
    known = {
        "name": Path(name).name or name,
        # An older talker may spell the family another way (an alias): the gateway uses the code name.
        "family": fam.name if fam is not None else talker.family,
        "sample_rate_hz": rate,
        "aliases": tuple({name, Path(name).name} - {""}),
        "language_tags": fam.language_tags if fam is not None else {},
        "budget": TextBudget.from_status(talker),
    }
    if not talker.HasField("catalog"):
        log.info("model %r: the talker reports no voice catalog; voices are not listed", name)
        return ModelInfo(**known, duplex_only=fam is not None and fam.duplex)
    c = talker.catalog
    return ModelInfo(
        **known,
        voices=tuple(VoiceInfo(v.name, tuple(v.languages), v.description) for v in c.voices),
        languages=tuple(c.languages),
        variant=c.variant or None,
        duplex_only=talker.duplex,
        takes_reference=c.voice_clone,
        needs_reference=c.reference_required,
        needs_reference_text=c.reference_text_required,
        takes_instructions=c.instructions,
    )


def voices_of(model: ModelInfo, language: str) -> list[speech_pb2.Voice]:
    """The catalog's voices, filtered by language; one unnamed entry when the voice list is unknown."""
    if model.voices is None:
        return [
            speech_pb2.Voice(
                name="",
                model=model.name,
                native_sample_rate_hz=model.sample_rate_hz,
                description="voice list unavailable: the talker does not report its voices",
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
