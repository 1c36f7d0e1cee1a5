"""Qwen3-TTS's part of ``bench/kv_fp8.py`` (its descriptor's ``Bench.kv_fp8``): the golden CustomVoice
checkpoint, the presets, and the whole frame's time (talker step + code predictor) at ``context`` positions.

The head compared is the talker's ``codec_head`` (c0; the code predictor's 15 heads follow the sampled c0
inside a frame, so only c0 is compared teacher-forced). Forcing writes the reference's next input
embedding; sampling is greedy without repetition penalty, so no other slot state differs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bench.kv_fp8_kit import Capture, Case, Driver, fits, timed
from services.talker.models import load_talker
from services.talker.sampling import SamplingParams
from services.talker.spec import SpeechSpec
from voxstage.presets import ModelSource, resolve_model

PRESETS = {"true": "qwen3-tts-0.6b", "tiny": "qwen3-tts-tiny"}
TEXTS = (
    "The quick brown fox jumps over the lazy dog, and then it runs far away into the forest.",
    "Streaming speech needs every frame on time, for every session at once.",
    "Memory bounds how many sessions fit; compute bounds how fast each frame runs.",
    "A small cache lets more people talk to the same machine.",
)


class QwenDriver(Driver):
    """``streams`` requests over one Qwen3-TTS adapter, each held open for ``frames`` frames."""

    family = "qwen3_tts"

    def __init__(self, adapter: Any, prepared: Sequence[Any], frames: int, max_len: int) -> None:
        self.adapter, self.prepared, self.frames = adapter, prepared, frames
        self.n = len(prepared)
        adapter.allocate(self.n, max_len)

    def start(self) -> None:
        a = self.adapter
        plain = SamplingParams(do_sample=False, repetition_penalty=1.0)
        for slot, p in enumerate(self.prepared):
            a.admit(slot, p, seed=slot, sampling=plain, subtalker=plain, min_frames=self.frames + 1)
            a.append_text(slot, 0, list(p.trailing_ids), True)
        a.prefill_many([(slot, p, 0, p.length - 1) for slot, p in enumerate(self.prepared)])
        for slot, p in enumerate(self.prepared):
            a.start_decode(slot, p)
        self.capture = Capture({"c0": a.model.codec_head})

    def end(self) -> int:
        return int(self.adapter.positions[: self.n].max())

    def step(self, forced: torch.Tensor | None = None) -> tuple[np.ndarray, dict[str, torch.Tensor]]:
        """One frame; ``forced [n, hidden]`` replaces the next input it made (the reference's)."""
        codes, _ = self.adapter.decode([True] * self.n, int(self.adapter.positions[: self.n].max()) + 1)
        logits = self.capture.take()
        logits["next_input"] = self.adapter.next_input[: self.n].clone()
        if forced is not None:
            self.adapter.next_input[: self.n] = forced
        return codes.copy(), logits


def qwen_case(source: ModelSource, device: str, dtype: torch.dtype, frames: int, streams: int):
    """A ``make(kv_cache_dtype)`` over fresh adapters of one model, one text and voice per stream."""
    adapter, info = load_talker(source, device=device, dtype=dtype)
    voice = info.voices
    specs = [SpeechSpec(text=TEXTS[i % len(TEXTS)], voice=voice[i % len(voice)]) for i in range(streams)]
    cls, model, tok = type(adapter), adapter.model, adapter.tokenizer

    def make(kv: str) -> Driver:
        a = cls(model, tok)
        a.use_kv_cache_dtype(kv)
        prepared = [a.prepare(spec) for spec in specs]
        max_len = max(p.length for p in prepared) + frames + 2
        return QwenDriver(a, prepared, frames, max_len)

    return make


def preset_case(
    name: str, device: str, dtype: torch.dtype, frames: int, streams: int
) -> Callable[[str], Driver]:
    return qwen_case(resolve_model(name), device, dtype, frames, streams)


def golden_cases(frames: int, streams: int, tmp: Path) -> list[Case]:
    from tests import golden

    path = golden.materialize_checkpoint("custom_voice", tmp / "qwen3_golden")
    source = ModelSource("golden", path, "qwen3_tts")
    make, yardstick = (qwen_case(source, "cpu", d, frames, streams) for d in (torch.float32, torch.bfloat16))
    return [("golden/qwen3_tts/custom_voice", make, yardstick)]


def frame_times(
    name: str, device: str, dtype: torch.dtype, sessions: list[int], iters: int, context: int
) -> list[dict]:
    """The whole frame (``Qwen3TTSAdapter.decode``: talker step + code predictor) at ``context`` positions."""
    base, _ = load_talker(resolve_model(name), device=device, dtype=dtype)
    out = []
    for kv in ("auto", "fp8"):
        for n in sessions:
            a = type(base)(base.model, base.tokenizer)
            a.use_kv_cache_dtype(kv)
            need = a.kv_bytes_per_token() * (context + 1) * n
            row: dict[str, Any] = {
                "kv_cache_dtype": kv,
                "sessions": n,
                "context": context,
                "kv_gib": need / 2**30,
            }
            if not fits(need, device):
                out.append(row | {"fits": False})
                continue
            a.allocate(n, context + 1)
            a.positions[:n].fill_(context - 1)
            if device == "cuda":
                a.enable_cuda_graphs()

            def step(a: Any = a, n: int = n) -> None:
                a.positions[:n].fill_(context - 1)  # the same context every frame
                a.decode([True] * n, context)

            row["frame"] = timed(step, device, iters)
            out.append(row | {"fits": True})
            del a
            if device == "cuda":
                torch.cuda.empty_cache()
    return out
