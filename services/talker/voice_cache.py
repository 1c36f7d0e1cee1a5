"""Ready voice prompts of voice-library voices, kept between requests (``stages[0].voice_cache_*``).

A request by an uploaded voice carries its encoded reference (codes, x-vector, transcript) and a
``voice_key`` (``<voice id>@<version>``). The first request of a key checks and decodes the reference into
what the family's prompt builder takes; later ones take that from here. A new upload is a new version, so a
re-uploaded voice never meets an entry of the one it replaced, and a deleted voice's entries are never
named again: least recently used entries leave first once the cache holds more than its bytes or entries.
Lives on the event loop (the servicer's), no model code.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from voxstage import metrics


@dataclass(frozen=True)
class VoicePrompt:
    speaker_embedding: np.ndarray | None
    ref_codes: np.ndarray | None
    ref_text: str | None

    @property
    def nbytes(self) -> int:
        parts = (self.speaker_embedding, self.ref_codes)
        return sum(p.nbytes for p in parts if p is not None) + len((self.ref_text or "").encode())


class VoiceCache:
    def __init__(self, max_bytes: int, max_entries: int) -> None:
        self.max_bytes = max_bytes
        self.max_entries = max_entries
        self._entries: OrderedDict[str, VoicePrompt] = OrderedDict()
        self.bytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: str) -> VoicePrompt | None:
        entry = self._entries.get(key)
        metrics.VOICE_CACHE.labels(result="hit" if entry is not None else "miss").inc()
        if entry is not None:
            self._entries.move_to_end(key)
        return entry

    def put(self, key: str, prompt: VoicePrompt) -> None:
        if key in self._entries or prompt.nbytes > self.max_bytes or self.max_entries == 0:
            return
        self._entries[key] = prompt
        self.bytes += prompt.nbytes
        while self.bytes > self.max_bytes or len(self._entries) > self.max_entries:
            _, old = self._entries.popitem(last=False)
            self.bytes -= old.nbytes
