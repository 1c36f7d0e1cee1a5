"""The talker engine's public types: its configuration, a request, an output and why a request ended."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from services.talker.pacing import Pacing
from services.talker.sampling import SamplingParams


class AdmissionError(RuntimeError):
    """The request cannot be taken now (queue full); maps to RESOURCE_EXHAUSTED."""


class RequestTooLarge(ValueError):
    """Prompt + max frames exceed ``max_model_len``; maps to INVALID_ARGUMENT."""


@dataclass(frozen=True)
class EngineConfig:
    max_num_seqs: int
    max_model_len: int
    max_num_batched_tokens: int
    max_queue: int = 1024
    enable_prefix_caching: bool = False
    prefix_cache_bytes: int = 256 * 1024 * 1024  # the adapter's bound on cached prefixes
    # Launch tick n+1 before reading tick n's results, so host work overlaps the device step. A request that
    # hit EOS at tick n then runs one wasted step at n+1 whose output is dropped.
    async_scheduling: bool = False
    # Pacing under load (services/talker/pacing.py): off unless the deploy file's pace_* keys set it.
    pacing: Pacing = field(default_factory=Pacing)


@dataclass
class TalkerRequest:
    request_id: str
    spec: Any  # family-specific prompt spec, interpreted by the adapter
    seed: int
    sampling: SamplingParams
    subtalker: SamplingParams
    max_frames: int
    min_frames: int = 2
    whole_clip: bool = False  # the client hears nothing before the end: pacing never holds it (pacing.py)


class Finish(enum.StrEnum):
    EOS = "eos"
    MAX_FRAMES = "max_frames"
    MAX_MODEL_LEN = "max_model_len"
    CANCELLED = "cancelled"
    ERROR = "error"


@dataclass
class TalkerOutput:
    request_id: str
    codes: np.ndarray  # [n, G] int64 frames produced this tick (n may be 0 on finish)
    first_frame: int
    finish: Finish | None = None
    error: str | None = None
