"""Model families of the talker stage, one folder each, behind ``TalkerAdapter`` / ``DuplexAdapter``.

``load_talker`` looks the checkpoint's family up in the registry (``voxstage.families``) and calls the
loader its descriptor names; each family's ``entry.py`` returns its adapter and a ``TalkerInfo``: what the
stage and its Status need to know about the loaded checkpoint (voices, languages, limits, capabilities),
so nothing outside the family's folder reads its config.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from services.talker.sampling import SamplingParams
from services.talker.spec import SpeechSpec
from voxstage.families import family, load_ref
from voxstage.presets import ModelSource


@dataclass(frozen=True)
class CatalogVoice:
    name: str
    languages: tuple[str, ...] = ()
    description: str = ""


@dataclass(frozen=True)
class Catalog:
    """What the served checkpoint offers, as the talker's Status reports it (``StageStatus.catalog``)."""

    voices: tuple[CatalogVoice, ...]  # in the checkpoint's order; the first is the default
    languages: tuple[str, ...]  # names a request may give besides "auto" (empty: the text's own language)
    voice_clone: bool = False  # reference audio clones a voice
    reference_required: bool = False  # every request must carry reference audio
    reference_text_required: bool = False  # reference audio must come with its transcript
    instructions: bool = False  # takes instructions (a voice description, a persona)
    voice_required: bool = False  # a request must name one of the voices


@dataclass(frozen=True)
class TalkerInfo:
    family: str
    model: str
    num_code_groups: int
    frame_rate_hz: float
    voices: tuple[str, ...]
    languages: tuple[str, ...]
    variant: str
    # The checkpoint's generation_config.json; the deploy file's default_sampling_params override it.
    default_sampling: SamplingParams
    default_subtalker_sampling: SamplingParams
    max_new_frames: int
    # The checkpoint's context limit in positions: max_model_len may not exceed it.
    max_positions: int
    catalog: Catalog
    # The model can start speaking before a segment's text is complete (a streaming-text prompt), so the
    # talker may start a segment early (SegmentsConfig.early_start_chars).
    streams_text: bool = False
    # What a request's prompt holds beyond the family's fixed positions (StageStatus, read by the gateway):
    # at most this many text tokens per UTF-8 byte of request text (a byte-level BPE, or SentencePiece with
    # byte fallback: 1), and this many positions per second of reference audio (frames in the prompt; 0:
    # the family takes no reference clip into its prompt).
    text_tokens_per_byte: float = 1.0
    reference_positions_per_second: float = 0.0
    # One short request that satisfies the checkpoint's prompt rules (text-to-speech warm-up).
    warm_up: SpeechSpec = field(default_factory=lambda: SpeechSpec(text="Warm up."))


def load_talker(
    source: ModelSource, *, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32
) -> tuple[Any, TalkerInfo]:
    """The family's adapter (``TalkerAdapter``, or ``DuplexAdapter`` for a duplex family) and what it
    serves."""
    loader = load_ref(family(source.family).talker)
    adapter, info = loader(source, device=device, dtype=dtype)
    return adapter, info
