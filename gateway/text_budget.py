"""The talker's request limits, checked at the gateway so that the stage never sees a request it must refuse.

The talker reports, in ``StageStatus``, how many text tokens one request's prompt may hold
(``text_token_limit``: its ``max_model_len`` less the family's fixed positions and the frames it must leave
room for), at most how many tokens its tokenizer makes of one UTF-8 byte, and how many prompt positions a
second of reference audio takes. The gateway has no tokenizer, so it bounds a text's tokens by its bytes:
the bound never undercounts, so a request that passes here fits the model. It is a bound, not a count: on
a byte-level BPE each byte counts as a token, so CJK text (3 bytes a character) meets the limit at about a
third of the characters of Latin text. Tokens are judged per take: each segment of a streaming call
(``flush``) is its own prompt, with the request's reference transcript, instructions and reference clip.
"""

from __future__ import annotations

import math
import unicodedata
from dataclasses import dataclass
from typing import Any

from gateway.errors import GatewayError, invalid
from voxstage.internal.v1 import stage_pb2


def text_bytes(text: str) -> int:
    """UTF-8 bytes of ``text``, or of its NFKC form when that is longer (tokenizers normalise before they
    split, and a compatibility character can grow: U+FDFA is 3 bytes, its NFKC form 33)."""
    raw = len(text.encode("utf-8", "surrogatepass"))
    if text.isascii():
        return raw
    return max(raw, len(unicodedata.normalize("NFKC", text).encode("utf-8", "surrogatepass")))


@dataclass(frozen=True)
class TextBudget:
    max_model_len: int
    limit: int  # text tokens (plus reference positions) one take's prompt may hold
    per_byte: float
    ref_per_second: float

    @classmethod
    def from_status(cls, status: stage_pb2.StageStatus) -> TextBudget | None:
        """None when the talker reports no limits (an older talker): it then judges every request itself."""
        if not status.max_model_len:
            return None
        return cls(
            status.max_model_len,
            status.text_token_limit,
            status.text_tokens_per_byte or 1.0,
            status.reference_positions_per_second,
        )

    def reference_positions(self, seconds: float) -> int:
        return math.ceil(self.ref_per_second * seconds)

    def refusal(self, field: str, what: str, cost: int) -> GatewayError:
        return invalid(
            field,
            f"too long for this model: {what} may take up to {cost} of the {self.limit} prompt positions one "
            f"request has for text and reference audio (talker max_model_len {self.max_model_len} less its "
            f"fixed prompt and room to speak; a UTF-8 byte of text counts as {self.per_byte:g} token)",
            reason="request_too_large",
        )

    def check(self, parts: list[tuple[str, str]], ref_seconds: float = 0.0, ref_field: str = "") -> int:
        """Refuse a take whose texts (``(field, text)`` pairs) and reference clip cannot fit, naming the field
        with the most tokens; returns the tokens left for more text (a streaming take's deltas)."""
        sizes = [(text_bytes(text), field) for field, text in parts if text]
        costs = [(math.ceil(self.per_byte * n), field) for n, field in sizes]
        ref = self.reference_positions(ref_seconds)
        total = sum(c for c, _ in costs) + ref
        if total > self.limit:
            field = max(costs)[1] if costs and max(costs)[0] >= ref else ref_field
            shown = [f"{n} bytes of {f}" for n, f in sizes]
            shown += [f"{ref_seconds:.1f} s of {ref_field}"] * bool(ref)
            raise self.refusal(field, " with ".join(shown) or "the request", total)
        return self.limit - total


class TakeBudget:
    """A streaming call's text, take by take: each segment's deltas may hold ``job.text_tokens_left``
    tokens (its reference transcript, instructions and clip are already counted)."""

    def __init__(self, job: Any, field: str) -> None:
        self.budget: TextBudget | None = job.model.budget
        self.left: int | None = job.text_tokens_left
        self.field = field
        self.bytes = 0  # of this take's text so far

    def add(self, text: str) -> None:
        if self.budget is None or self.left is None:
            return
        self.bytes += text_bytes(text)
        cost = math.ceil(self.budget.per_byte * self.bytes)
        if cost > self.left:
            used = self.budget.limit - self.left
            what = f"this segment's {self.bytes} bytes of {self.field} (a flush starts a new segment)"
            raise self.budget.refusal(self.field, what, cost + used)

    def flushed(self) -> None:
        self.bytes = 0
