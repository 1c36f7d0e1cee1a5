"""What the talker stage asks of Audio8-TTS (named by ``voxstage.families.audio8_tts``): the loaded adapter
and what the checkpoint offers, and the talker's files of a preset directory."""

from __future__ import annotations

from pathlib import Path

import torch

from services.talker.models import Catalog, CatalogVoice, TalkerInfo
from services.talker.sampling import SamplingParams
from voxstage.families import Preset
from voxstage.families.audio8_tts import OWN_VOICE
from voxstage.presets import ModelSource

from . import presets
from .adapter import VOICES, Audio8TTSAdapter
from .config import read_config, read_generation_config
from .loader import load_audio8_talker, random_init
from .tokenizer import Audio8Tokenizer


def load_talker(
    source: ModelSource, *, device: str | torch.device, dtype: torch.dtype
) -> tuple[Audio8TTSAdapter, TalkerInfo]:
    if source.random_init:  # size-true preset: weights drawn on the device
        config = read_config(source.path)
        model = random_init(config, seed=source.seed, device=device, dtype=dtype)
        tokenizer = Audio8Tokenizer.from_dir(source.path)
    else:
        model, config, tokenizer = load_audio8_talker(source.path, device=device, dtype=dtype)
    gen = read_generation_config(source.path)
    sampling = SamplingParams(
        do_sample=gen.do_sample, temperature=gen.temperature, top_k=gen.top_k, top_p=gen.top_p
    )
    own = CatalogVoice(OWN_VOICE, (), "the model's own voice; send ref_audio and ref_text to clone one")
    info = TalkerInfo(
        family="audio8_tts",
        model=source.name,
        num_code_groups=config.num_codebooks,
        frame_rate_hz=config.frame_rate_hz,
        voices=VOICES,
        # The model reads the text's language (11 of them, docs/models.md); it takes no language switch.
        languages=("auto",),
        # Its own voice, or one cloned from reference audio + transcript.
        variant="plain",
        default_sampling=sampling,
        # The released model samples the fast AR with the same settings as the semantic token.
        default_subtalker_sampling=sampling,
        max_new_frames=config.max_seq_len,
        max_positions=config.max_seq_len,  # packed prompt + frames
        reference_positions_per_second=config.frame_rate_hz,  # a clone's reference frames
        catalog=Catalog(voices=(own,), languages=(), voice_clone=True, reference_text_required=True),
    )
    return Audio8TTSAdapter(model, tokenizer), info


def write_preset(preset: Preset, out: Path, seed: int) -> None:
    """The talker's files: one flat ``config.json`` with the released codec fields (the codec's writer sets
    its geometry), ``generation_config.json``, ``tokenizer.json`` and, for the tiny preset,
    ``model.safetensors``."""
    random_init = presets.write_preset(preset.name, out, seed=seed)
    assert random_init == preset.random_init, f"{preset.name}: the descriptor and the writer disagree"
