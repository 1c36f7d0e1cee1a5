"""Decoder states of voice-library voices right after their reference prefix (``codec_voice_state_*``).

A voice-clone stream opens with its reference codes as a decode prefix: the codec decodes them only to bring
its stateful decoder to where the reference ends, and drops their audio (``CodecEngine``). For a
voice-library voice (the open's ``voice_key``, ``<voice id>@<version>``) that work is the same on every
request, so the engine keeps the slot's state as it stands after the prefix, and a later stream of the same
key starts from a copy of it instead of decoding the prefix again: the same state, so the same PCM bit for
bit. An entry also keeps the prefix codes and is only used for a prefix equal to them, so a key can never
hand out the state of other codes. A new upload is a new version, so a re-uploaded voice never meets an entry
of the one it replaced, and a deleted voice's entries are never named again: least recently used entries
leave first once the cache holds more than its bytes or entries.

Family-neutral: the states are whatever the family's decoder pool snapshots (its
``CodecRuntime.decoder_snapshots`` says whether it can); they live where the pool does (device memory on a
GPU). Owned by the engine thread.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from voxstage import metrics


class DecoderSnapshot(Protocol):
    @property
    def nbytes(self) -> int: ...


@dataclass(frozen=True)
class VoiceState:
    prefix: np.ndarray  # the reference codes [frames, groups] whose decode left this state
    state: DecoderSnapshot

    @property
    def nbytes(self) -> int:
        return self.prefix.nbytes + self.state.nbytes


class VoiceStateCache:
    def __init__(self, max_bytes: int, max_entries: int) -> None:
        if max_bytes < 0 or max_entries < 0:
            raise ValueError(f"voice state cache bounds must be >= 0, got {max_bytes} B and {max_entries}")
        self.max_bytes = max_bytes
        self.max_entries = max_entries
        self._entries: OrderedDict[str, VoiceState] = OrderedDict()
        self.bytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: str, prefix: np.ndarray) -> DecoderSnapshot | None:
        """The state after ``prefix`` stored under ``key``; None unless its prefix is ``prefix`` exactly."""
        entry = self._entries.get(key)
        if entry is not None and not np.array_equal(entry.prefix, prefix):
            entry = None  # the same key with other codes (never from the gateway): decode them instead
        metrics.CODEC_VOICE_STATES.labels(result="hit" if entry is not None else "miss").inc()
        if entry is None:
            return None
        self._entries.move_to_end(key)
        return entry.state

    def put(self, key: str, prefix: np.ndarray, state: DecoderSnapshot) -> None:
        entry = VoiceState(np.array(prefix, dtype=np.int64, copy=True), state)
        if key in self._entries or entry.nbytes > self.max_bytes or self.max_entries == 0:
            return
        self._entries[key] = entry
        self.bytes += entry.nbytes
        while self.bytes > self.max_bytes or len(self._entries) > self.max_entries:
            _, old = self._entries.popitem(last=False)
            self.bytes -= old.nbytes
