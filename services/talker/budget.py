"""What one request may hold, as the talker reports it in ``StageStatus`` for the gateway to check first.

A request's prompt is the family's fixed positions (``prompt_overhead``: template, role, speaker, language
tokens, silences), its texts' tokens (text, reference transcript, instructions or persona) and, for a voice
clone, its reference clip's frames; with the frames it must produce (``reserve``) it must fit
``max_model_len``. The gateway cannot tokenize, so the family also bounds tokens per UTF-8 byte of text:
the check is then safe without the tokenizer (docs/operations.md, "Request limits"), and the talker's exact
check at submit (``TalkerEngine._check_fits``) stays behind it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from services.talker.models import TalkerInfo
from voxstage.internal.v1 import stage_pb2

if TYPE_CHECKING:
    from services.talker.adapter import TalkerAdapter
    from services.talker.duplex.engine import DuplexAdapter


@dataclass(frozen=True)
class RequestBudget:
    max_model_len: int
    text_token_limit: int
    text_tokens_per_byte: float
    reference_positions_per_second: float

    @classmethod
    def of(
        cls, adapter: TalkerAdapter | DuplexAdapter, info: TalkerInfo, max_model_len: int, reserve: int
    ) -> RequestBudget | None:
        """On the engine thread (the overhead is measured on built prompts); None: the family cannot say."""
        overhead = adapter.prompt_overhead()
        if overhead is None:
            return None
        limit = max(max_model_len - overhead - reserve, 0)
        return cls(max_model_len, limit, info.text_tokens_per_byte, info.reference_positions_per_second)

    def fill(self, status: stage_pb2.StageStatus) -> None:
        status.max_model_len = self.max_model_len
        status.text_token_limit = self.text_token_limit
        status.text_tokens_per_byte = self.text_tokens_per_byte
        status.reference_positions_per_second = self.reference_positions_per_second
