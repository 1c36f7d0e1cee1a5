"""What the talker stage asks of PersonaPlex (named by ``voxstage.families.personaplex``): the loaded
duplex adapter and what the checkpoint offers, and the talker's files of a preset directory."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from services.talker.models import Catalog, CatalogVoice, TalkerInfo
from services.talker.sampling import SamplingParams
from voxstage.families import Preset
from voxstage.presets import ModelSource

from .adapter import PersonaPlexAdapter
from .config import parse_lm_config
from .loader import load_personaplex_lm, random_init, read_config, save_checkpoint
from .presets import PRESET_VOICES, preset_config, voice_codes
from .tokenizer import PersonaTokenizer, tiny_tokenizer_model
from .voices import VoiceLibrary, voice_from_codes


def load_talker(
    source: ModelSource, *, device: str | torch.device, dtype: torch.dtype
) -> tuple[PersonaPlexAdapter, TalkerInfo]:
    if source.random_init:
        # Size-true preset: weights drawn on the device; its stored voices are made from seeded codes.
        model = random_init(read_config(source.path), seed=source.seed, device=device, dtype=dtype)
        tokenizer = PersonaTokenizer(tiny_tokenizer_model())
        made = {name: voice_from_codes(model, voice_codes(name)) for name in PRESET_VOICES}
        voices = VoiceLibrary.of(made, source=source.name)
    else:
        model, tokenizer, voices = load_personaplex_lm(source.path, device=device, dtype=dtype)
    info = TalkerInfo(
        family="personaplex",
        model=source.name,
        num_code_groups=8,
        frame_rate_hz=12.5,
        voices=voices.names,
        languages=("auto",),
        variant="duplex",
        # moshi's server defaults (text 0.7 / top-k 25, audio 0.8 / top-k 250); deploy files override them.
        default_sampling=SamplingParams(temperature=0.7, top_k=25),
        default_subtalker_sampling=SamplingParams(temperature=0.8, top_k=250),
        max_new_frames=model.config.context,
        max_positions=model.config.context,
        reference_positions_per_second=12.5,  # a voice recording's Mimi frames open the prompt
        # Stored voices (or one from a voice recording) and a persona in the instructions.
        catalog=Catalog(
            voices=tuple(CatalogVoice(name, (), "stored voice") for name in voices.names),
            languages=(),
            voice_clone=True,
            instructions=True,
        ),
    )
    return PersonaPlexAdapter(model, tokenizer, voices), info


def write_preset(preset: Preset, out: Path, seed: int) -> None:
    """The talker's files: ``config.json`` (moshi kwargs; ``{}`` for the 7B, as shipped) and, for the tiny
    preset, ``model.safetensors``, the SentencePiece tokenizer and ``voices/``. The 7B draws its weights on
    its device at load."""
    lm_kwargs = preset_config(preset.name)
    out.mkdir(parents=True, exist_ok=True)
    if preset.random_init:
        (out / "config.json").write_text(json.dumps(lm_kwargs, indent=2) + "\n")
        return
    with torch.no_grad():
        model = random_init(parse_lm_config(lm_kwargs, source=preset.name), seed=seed)
        voices = {v: voice_from_codes(model, voice_codes(v)) for v in PRESET_VOICES}
        save_checkpoint(out, model, lm_kwargs, tokenizer_model=tiny_tokenizer_model(), voices=voices)
