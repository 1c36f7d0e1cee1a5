"""The toy family's codec: each frame is 640 samples (16 kHz, 25 frames/s) of a tone at 100 Hz + 10 Hz per
unit of the frame's first code, its phase carried across chunks in the stream's slot."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import torch

from services.codec.models import CodecRuntime
from voxstage.families import Preset
from voxstage.presets import ModelSource

RATE, SPF = 16_000, 640


def tone(first_codes: np.ndarray, phase: float = 0.0) -> tuple[np.ndarray, float]:
    """PCM of frames whose first codes are ``first_codes``, starting at ``phase``; and the phase after."""
    out = []
    for code in first_codes:
        step = 2 * math.pi * (100.0 + 10.0 * int(code)) / RATE
        out.append(0.25 * np.sin(phase + step * np.arange(SPF)))
        phase = (phase + step * SPF) % (2 * math.pi)
    return (np.concatenate(out) if out else np.zeros(0)).astype(np.float32), phase


class ToyPool:
    samples_per_frame = SPF

    def __init__(self, max_streams: int) -> None:
        self.max_streams = max_streams
        self.phase = np.zeros(max_streams)

    def reset(self, slots: torch.Tensor) -> None:
        self.phase[slots.cpu().numpy()] = 0.0

    def decode(
        self, codes: torch.Tensor, slots: torch.Tensor, lengths: torch.Tensor | None = None
    ) -> torch.Tensor:
        b, _, t = codes.shape
        wav = torch.zeros(b, t * SPF)
        for row in range(b):
            n = t if lengths is None else int(lengths[row])
            slot = int(slots[row])
            pcm, self.phase[slot] = tone(codes[row, 0, :n].cpu().numpy(), self.phase[slot])
            wav[row, : n * SPF] = torch.from_numpy(pcm)
        return wav

    def state_bytes_per_stream(self) -> int:
        return 8


def load_codec(source: ModelSource, *, device: Any, dtype: Any, max_streams: int) -> CodecRuntime:
    codec = json.loads((source.path / "codec.json").read_text())
    return CodecRuntime(
        family="toy_tts",
        model=source.name,
        decoder=ToyPool(2 * max_streams),
        encoder=torch.nn.Identity(),  # no voice clone: never called
        speaker_encoder=None,
        num_groups=2,
        codebook_size=256,
        sample_rate=codec["sample_rate"],
        samples_per_frame=SPF,
        decoder_window_frames=1 << 20,  # stateful: a stream's whole past is in its phase
        state_bytes_per_stream=8,
    )


def write_preset(preset: Preset, out: Path, seed: int) -> None:
    (out / "codec.json").write_text(json.dumps({"sample_rate": RATE}) + "\n")
