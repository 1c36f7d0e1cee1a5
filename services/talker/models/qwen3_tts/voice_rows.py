"""The device rows of the clone references in use, kept between a voice's requests (``VoiceRows``)."""

from __future__ import annotations

import weakref
from typing import Any

import numpy as np

from .prompt import VoiceEmbeds


class VoiceRows:
    """The device rows of the clone references in use (``prompt.VoiceEmbeds``), keyed by the identity of
    their host arrays: a voice-library voice's requests share the arrays of its ``VoiceCache`` entry, so its
    later prompts skip the reference's upload and embedding. An entry lives as long as its x-vector array, so
    the voice cache's bounds (``stages[0].voice_cache_*``) bound this one too, and an inline reference's
    entry goes with its request. Written on the engine thread; a finalizer may drop an entry from another."""

    def __init__(self) -> None:
        # id(x-vector) -> (x-vector, ICL codes or None, rows); weak, so an entry never keeps its arrays alive
        self._rows: dict[int, tuple[weakref.ref[Any], weakref.ref[Any] | None, VoiceEmbeds]] = {}

    def __len__(self) -> int:
        return len(self._rows)

    def get(self, emb: object, codes: object) -> VoiceEmbeds | None:
        hit = self._rows.get(id(emb)) if isinstance(emb, np.ndarray) else None
        if hit is None:
            return None
        emb_ref, codes_ref, rows = hit
        if emb_ref() is not emb or (codes_ref() if codes_ref is not None else None) is not codes:
            return None
        return rows

    def put(self, emb: object, codes: object, rows: VoiceEmbeds) -> None:
        if not isinstance(emb, np.ndarray) or (codes is not None and not isinstance(codes, np.ndarray)):
            return
        key = id(emb)
        self._rows[key] = (weakref.ref(emb), weakref.ref(codes) if codes is not None else None, rows)
        weakref.finalize(emb, self._rows.pop, key, None)
