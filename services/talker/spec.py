"""The family-neutral description of one speech request, as the talker servicer receives it."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class SpeechSpec:
    text: str
    voice: str | None = None
    language: str = "auto"
    instructions: str | None = None
    speaker_embedding: np.ndarray | None = None  # x-vector from the codec stage's speaker encoder
    ref_text: str | None = None  # voice-clone ICL transcript
    ref_codes: np.ndarray | None = None  # [T_ref, G] codec frames of the reference audio
    non_streaming: bool | None = None  # None: the family's default for whole-text requests
    text_complete: bool = True  # False: more text arrives as deltas
