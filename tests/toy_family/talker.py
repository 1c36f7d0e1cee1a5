"""The toy family's talker: one frame per byte of text, two codes each (the byte, and the byte plus the frame
index), end of speech after the last byte. Slots are packed as the engine expects; everything is numpy."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from services.talker.adapter import TalkerAdapter
from services.talker.models import Catalog, CatalogVoice, TalkerInfo
from services.talker.sampling import SamplingParams
from services.talker.spec import SpeechSpec
from voxstage.families import Preset
from voxstage.presets import ModelSource

GROUPS = 2
END = 256  # the text id after the last byte


class ToyPrompt:
    """A one-position prompt; the text's bytes trail it, one per frame."""

    def __init__(self, spec: SpeechSpec) -> None:
        self.ids: list[int] = list(spec.text.encode())
        self.text_complete = spec.text_complete
        if self.text_complete:
            self.ids.append(END)

    ready = True
    length = 1
    prefix_key = None
    prefix_length = 0

    @property
    def trailing_ids(self) -> Sequence[int]:
        return self.ids

    def extend_text(self, text: str, complete: bool) -> None:
        self.ids += list(text.encode())
        if complete and not self.text_complete:
            self.ids.append(END)
        self.text_complete = complete


class ToyAdapter(TalkerAdapter):
    num_groups = GROUPS
    codebook_size = 256

    def kv_bytes_per_token(self) -> int:
        return 8

    def allocate(self, num_slots: int, max_len: int) -> None:
        self.text = [[] for _ in range(num_slots)]  # type: list[list[int]]
        self.frame = np.zeros(num_slots, np.int64)

    def prepare(self, spec: Any) -> ToyPrompt:
        return ToyPrompt(spec)

    def admit(self, slot: int, prepared: Any, **_: Any) -> None:
        self.text[slot], self.frame[slot] = [], 0

    def append_text(self, slot: int, queued: int, ids: Sequence[int], complete: bool) -> None:
        self.text[slot][queued:] = list(ids)

    def prefill_many(self, chunks: Sequence[tuple[int, Any, int, int]]) -> None:
        return None  # a one-position prompt is its own first decode input: nothing to prefill

    def start_decode(self, slot: int, prepared: Any) -> None:
        return None

    def launch(self, active: Sequence[bool], attn_len: int) -> tuple[np.ndarray, np.ndarray]:
        n = len(active)
        codes = np.zeros((n, GROUPS), np.int64)
        eos = np.zeros(n, bool)
        for i, on in enumerate(active):
            if not on:
                continue
            t = int(self.frame[i])
            # With async scheduling a slot runs one step past its end (the engine drops its output).
            byte = self.text[i][t] if t < len(self.text[i]) else END
            eos[i] = byte == END
            codes[i] = (byte % 256, (byte + t) % 256)
            self.frame[i] += 1
        return codes, eos

    def collect(self, handle: object) -> tuple[np.ndarray, np.ndarray]:
        codes, eos = handle  # type: ignore[misc]
        return codes, eos

    def move_slot(self, src: int, dst: int, kv_len: int) -> None:
        self.text[dst], self.frame[dst] = self.text[src], self.frame[src]

    def reuse_prefix(self, slot: int, prepared: Any, limit: int) -> int:
        return 0

    def store_prefix(self, slot: int, prepared: Any) -> None:
        return None


def load_talker(source: ModelSource, *, device: Any, dtype: Any) -> tuple[ToyAdapter, TalkerInfo]:
    config = json.loads((source.path / "config.json").read_text())
    voice = CatalogVoice(config["voice"], (), "the toy's one voice")
    info = TalkerInfo(
        family="toy_tts",
        model=source.name,
        num_code_groups=GROUPS,
        frame_rate_hz=25.0,
        voices=(voice.name,),
        languages=("auto",),
        variant="plain",
        default_sampling=SamplingParams(),
        default_subtalker_sampling=SamplingParams(),
        max_new_frames=config["max_frames"],
        max_positions=config["max_positions"],
        catalog=Catalog(voices=(voice,), languages=()),
    )
    return ToyAdapter(), info


def write_preset(preset: Preset, out: Path, seed: int) -> None:
    config = {"model_type": "toy_tts", "voice": "toy", "max_frames": 512, "max_positions": 4096}
    (out / "config.json").write_text(json.dumps(config) + "\n")
