"""Model families of the talker stage, one folder each, behind ``TalkerAdapter``.

``load_talker`` is the only place the stage looks at which family a checkpoint is.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from services.talker.adapter import TalkerAdapter
from services.talker.sampling import SamplingParams
from voxstage.presets import ModelSource


@dataclass(frozen=True)
class TalkerInfo:
    family: str
    model: str
    num_code_groups: int
    frame_rate_hz: float
    voices: tuple[str, ...]
    languages: tuple[str, ...]
    variant: str
    # The checkpoint's generation_config.json; the deploy file's default_sampling_params override it.
    default_sampling: SamplingParams
    default_subtalker_sampling: SamplingParams
    max_new_frames: int
    # The model can start speaking before a segment's text is complete (a streaming-text prompt), so the
    # talker may start a segment early (SegmentsConfig.early_start_chars).
    streams_text: bool = False


def load_talker(
    source: ModelSource,
    *,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
    prefix_cache_bytes: int = 256 * 1024 * 1024,
) -> tuple[TalkerAdapter, TalkerInfo]:
    if source.family == "personaplex":
        return _load_personaplex(source, device=device, dtype=dtype)  # type: ignore[return-value]
    if source.family == "arktts":
        return _load_audio8_tts(source, device=device, dtype=dtype)
    if source.family != "qwen3_tts":
        raise ValueError(f"talker: model family {source.family!r} is not implemented")
    from services.talker.models.qwen3_tts.adapter import Qwen3TTSAdapter
    from services.talker.models.qwen3_tts.loader import load_qwen3_tts_talker, random_init, read_config
    from services.talker.models.qwen3_tts.tokenizer import QwenTextTokenizer

    if source.random_init:
        config = read_config(source.path)
        model = random_init(config, seed=source.seed, device=device, dtype=dtype)
        tokenizer = QwenTextTokenizer.from_dir(source.path)
    else:
        model, config, tokenizer = load_qwen3_tts_talker(source.path, device=device, dtype=dtype)
    t = config.talker
    gen = config.generation
    info = TalkerInfo(
        family="qwen3_tts",
        model=source.name,
        streams_text=True,
        num_code_groups=t.num_code_groups,
        frame_rate_hz=12.5,
        voices=tuple(sorted(t.spk_id)),
        languages=("auto", *sorted(k for k in t.codec_language_id if "dialect" not in k)),
        variant=config.tts_model_type,
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
    )
    return Qwen3TTSAdapter(model, tokenizer, prefix_cache_bytes=prefix_cache_bytes), info


def _load_personaplex(
    source: ModelSource, *, device: str | torch.device, dtype: torch.dtype
) -> tuple[object, TalkerInfo]:
    from services.talker.models.personaplex.adapter import PersonaPlexAdapter
    from services.talker.models.personaplex.loader import load_personaplex_lm, random_init, read_config
    from services.talker.models.personaplex.presets import PRESET_VOICES, voice_codes
    from services.talker.models.personaplex.tokenizer import PersonaTokenizer, tiny_tokenizer_model
    from services.talker.models.personaplex.voices import VoiceLibrary, voice_from_codes

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
    )
    return PersonaPlexAdapter(model, tokenizer, voices), info



def _load_audio8_tts(
    source: ModelSource, *, device: str | torch.device, dtype: torch.dtype
) -> tuple[TalkerAdapter, TalkerInfo]:
    from services.talker.models.audio8_tts.adapter import VOICES, Audio8TTSAdapter
    from services.talker.models.audio8_tts.config import read_config, read_generation_config
    from services.talker.models.audio8_tts.loader import load_audio8_talker, random_init
    from services.talker.models.audio8_tts.tokenizer import Audio8Tokenizer

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
    info = TalkerInfo(
        family="arktts",
        model=source.name,
        num_code_groups=config.num_codebooks,
        frame_rate_hz=config.frame_rate_hz,
        voices=VOICES,
        # The model reads the text's language (11 of them, docs/models.md); it takes no language switch.
        languages=("auto",),
        # Its own voice, or one cloned from reference audio + transcript (the gateway's "plain" variant).
        variant="plain",
        default_sampling=sampling,
        # The released model samples the fast AR with the same settings as the semantic token.
        default_subtalker_sampling=sampling,
        max_new_frames=config.max_seq_len,
    )
    return Audio8TTSAdapter(model, tokenizer), info  # type: ignore[return-value]
