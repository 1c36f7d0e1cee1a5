"""What the talker stage asks of Qwen3-TTS (named by ``voxstage.families.qwen3_tts``): the loaded adapter
and what the checkpoint offers, and the talker's files of a preset directory."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch

from services.talker.models import Catalog, CatalogVoice, TalkerInfo
from services.talker.sampling import SamplingParams
from services.talker.spec import SpeechSpec
from voxstage.families import Preset
from voxstage.presets import ModelSource

from . import presets
from .adapter import Qwen3TTSAdapter
from .config import Qwen3TTSConfig, parse_config
from .loader import load_qwen3_tts_talker, random_init, read_config, talker_checkpoint_state
from .tokenizer import QwenTextTokenizer, write_tiny_tokenizer


def load_talker(
    source: ModelSource, *, device: str | torch.device, dtype: torch.dtype
) -> tuple[Qwen3TTSAdapter, TalkerInfo]:
    if source.random_init:
        config = read_config(source.path)
        model = random_init(config, seed=source.seed, device=device, dtype=dtype)
        tokenizer = QwenTextTokenizer.from_dir(source.path)
    else:
        model, config, tokenizer = load_qwen3_tts_talker(source.path, device=device, dtype=dtype)
    t = config.talker
    gen = config.generation
    variant = config.tts_model_type
    info = TalkerInfo(
        family="qwen3_tts",
        model=source.name,
        streams_text=True,
        num_code_groups=t.num_code_groups,
        frame_rate_hz=12.5,
        voices=tuple(sorted(t.spk_id)),
        languages=("auto", *sorted(k for k in t.codec_language_id if "dialect" not in k)),
        variant=variant,
        default_sampling=SamplingParams(
            do_sample=gen.do_sample,
            temperature=gen.temperature,
            top_k=gen.top_k,
            top_p=gen.top_p,
            repetition_penalty=gen.repetition_penalty,
        ),
        default_subtalker_sampling=SamplingParams(
            do_sample=gen.subtalker_do_sample,
            temperature=gen.subtalker_temperature,
            top_k=gen.subtalker_top_k,
            top_p=gen.subtalker_top_p,
        ),
        max_new_frames=gen.max_new_tokens,
        max_positions=t.backbone.max_position_embeddings,
        # Voice clone (ICL): the reference clip's codec frames are prompt positions.
        reference_positions_per_second=12.5 if variant == "base" else 0.0,
        catalog=_catalog(config),
        # The warm-up must satisfy the variant's prompt rules: a preset speaker, or an x-vector for Base.
        warm_up=SpeechSpec(
            text="Warm up.",
            voice=min(t.spk_id) if t.spk_id else None,
            speaker_embedding=np.zeros(t.backbone.hidden_size, np.float32) if variant == "base" else None,
            instructions="Speak calmly." if variant == "voice_design" else None,
        ),
    )
    return Qwen3TTSAdapter(model, tokenizer), info


def _catalog(config: Qwen3TTSConfig) -> Catalog:
    """Speakers in the checkpoint's order (the first is the default), each speaking every language; dialects
    are reached through their speakers, never requested directly (the talker rejects them)."""
    t = config.talker
    languages = tuple(k.lower() for k in t.codec_language_id if "dialect" not in k.lower())
    voices = []
    for name in t.spk_id:
        dialect = t.spk_is_dialect.get(name)
        description = f"preset speaker ({dialect.replace('_', ' ')})" if isinstance(dialect, str) else ""
        voices.append(CatalogVoice(name.lower(), languages, description or "preset speaker"))
    variant = config.tts_model_type
    return Catalog(
        voices=tuple(voices),
        languages=languages,
        voice_clone=variant == "base",
        reference_required=variant == "base",
        instructions=variant != "base",
        voice_required=variant == "custom_voice",
    )


def _write_json(path: Path, data: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n")


def write_preset(preset: Preset, out: Path, seed: int) -> None:
    """The talker's files: ``config.json`` (the speaker encoder's config is the codec's to complete),
    ``generation_config.json``, the tokenizer and, for the tiny preset, ``model.safetensors``."""
    from safetensors.torch import save_file

    size, variant = preset.options["size"], preset.options["variant"]
    config: dict[str, Any] = presets.preset_config(size, variant)  # type: ignore[arg-type]
    generation = presets.preset_generation_config()
    _write_json(out / "config.json", config)
    _write_json(out / "generation_config.json", generation)
    # The tiny byte-level BPE stands in for Qwen's 151k vocabulary at every size: benchmarks feed token ids
    # whose count, not identity, sets the cost.
    write_tiny_tokenizer(out)
    if not preset.random_init:
        with torch.no_grad():
            talker = random_init(parse_config(config, generation, source=preset.name), seed=seed)
            save_file(talker_checkpoint_state(talker), str(out / "model.safetensors"))
