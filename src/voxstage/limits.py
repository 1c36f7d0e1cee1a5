"""Numeric limits of the public API, defined once.

The gateway checks every numeric request field against these before the value goes into a protobuf
(HTTP) or is forwarded (gRPC); the talker checks what reaches it against the same objects, so both refuse
with the same words; docs/api.md ("Numeric limits") lists ``describe()`` of each, and a test parses that
table so the two cannot drift.

Seeds are ``[0, 2**63)`` everywhere. The public ``seed`` fields are uint64, but the talker's samplers keep
seeds in int64 tensors, so the upper half of the uint64 range cannot be honoured; refusing it at the edge
(with the talker's own message) beats accepting it over HTTP and failing later in a stage.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass

from voxstage.quote import quoted

FLOAT32_MAX = 3.4028234663852886e38


def _int_text(n: int) -> str:
    # Wire-type bounds read better as powers of two (2**31, 2**63) than as 19-digit numbers.
    return f"2**{n.bit_length() - 1}" if n >= 1024 and n & (n - 1) == 0 else str(n)


def _shown(value: object) -> str:
    # A refused value is echoed in the error; a 400-digit integer need not be (voxstage.quote's rule).
    return quoted(value)


def _as_float32(value: float) -> float:
    """What a protobuf ``float`` field stores for ``value`` (the talker sees this, not the double)."""
    return float(struct.unpack("<f", struct.pack("<f", value))[0])


@dataclass(frozen=True)
class IntRange:
    """Integers in ``[low, end)``, plus optionally one ``special`` value outside it (top_k -1 = off)."""

    name: str
    low: int
    end: int  # exclusive
    special: int | None = None
    special_means: str = ""

    @property
    def span(self) -> str:
        if self.end >= 1024 and self.end & (self.end - 1) == 0:
            return f"[{self.low}, {_int_text(self.end)})"
        return f"[{self.low}, {self.end - 1}]"

    def describe(self) -> str:
        """The accepted values as docs/api.md's table states them."""
        if self.special is None:
            return self.span
        return f"{self.special} ({self.special_means}) or {self.span}"

    def accepts(self, value: int) -> bool:
        return value == self.special or self.low <= value < self.end

    def problem(self, value: object) -> str | None:
        """Why ``value`` is refused (``must be ..., got ...``), or None when it is accepted."""
        lead = "" if self.special is None else f"{self.special} ({self.special_means}) or "
        if isinstance(value, bool) or not isinstance(value, int):
            return f"must be an integer, {lead}in {self.span}, got {_shown(value)}"
        if self.accepts(value):
            return None
        return f"must be {lead}in {self.span}, got {_shown(value)}"


@dataclass(frozen=True)
class FloatRange:
    """Finite numbers between ``low`` and ``high``; either end may be open. Checked as float32, since that is
    what the protobuf carries: 1e-50 passes ``> 0`` as a double but reaches the talker as 0."""

    name: str
    low: float
    high: float
    low_open: bool = False
    high_open: bool = False

    @property
    def span(self) -> str:
        return f"{'(' if self.low_open else '['}{self.low:g}, {self.high:g}{')' if self.high_open else ']'}"

    def describe(self) -> str:
        return self.span

    def _inside(self, v: float) -> bool:
        above = v > self.low if self.low_open else v >= self.low
        below = v < self.high if self.high_open else v <= self.high
        return above and below

    def problem(self, value: object) -> str | None:
        if isinstance(value, bool) or not isinstance(value, int | float):
            return f"must be a number in {self.span}, got {_shown(value)}"
        try:
            v = float(value)
        except OverflowError:  # an int beyond any float
            return f"must be a number in {self.span}, got {_shown(value)}"
        if not math.isfinite(v):
            return f"must be a finite number in {self.span}, got {_shown(value)}"
        if not self._inside(v):
            return f"must be in {self.span}, got {_shown(v)}"
        if abs(v) > FLOAT32_MAX or not self._inside(_as_float32(v)):
            return f"must be in {self.span} as a 32-bit float, got {_shown(v)}"
        return None


SEED = IntRange("seed", 0, 2**63)
TOP_K = IntRange("top_k", 1, 2**31, special=-1, special_means="off")  # int32 on the wire
TOP_P = FloatRange("top_p", 0.0, 1.0, low_open=True)
# No sampler needs more than this; the bound keeps every value finite in float32 (logits / temperature).
TEMPERATURE = FloatRange("temperature", 0.0, 100.0)  # 0 = greedy
REPETITION_PENALTY = FloatRange("repetition_penalty", 0.0, 100.0, low_open=True)
MAX_FRAMES = IntRange("max_frames", 1, 2**32)  # uint32 on the wire
SAMPLE_RATE = IntRange("sample_rate", 8000, 48001, special=0, special_means="native")
CHUNK_FRAMES = IntRange("chunk_frames", 0, 1001)  # 0 keeps the deploy file's
REFERENCE_SAMPLE_RATE = IntRange("reference_sample_rate", 8000, 48001)
REFERENCE_BYTES = IntRange("reference_bytes", 1, 10 * 1024 * 1024 + 1)  # decoded bytes (base64 is 4/3 more)
REFERENCE_SECONDS = FloatRange("reference_seconds", 0.0, 60.0, low_open=True)
# Decoding downmixes block by block, so channels cost time, not memory; 8 covers 7.1 recordings.
REFERENCE_CHANNELS = IntRange("reference_channels", 1, 9)

ALL: tuple[IntRange | FloatRange, ...] = (
    SEED,
    TOP_K,
    TOP_P,
    TEMPERATURE,
    REPETITION_PENALTY,
    MAX_FRAMES,
    SAMPLE_RATE,
    CHUNK_FRAMES,
    REFERENCE_SAMPLE_RATE,
    REFERENCE_BYTES,
    REFERENCE_SECONDS,
    REFERENCE_CHANNELS,
)
