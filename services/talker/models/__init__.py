"""Model families of the talker stage, one folder each, behind ``TalkerAdapter``.

``load_talker`` is the only place the stage looks at which family a checkpoint is.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from voxstage.presets import ModelSource
from voxstage.talker.adapter import TalkerAdapter
from voxstage.talker.sampling import SamplingParams


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


def load_talker(
    source: ModelSource,
    *,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
    prefix_cache_bytes: int = 256 * 1024 * 1024,
) -> tuple[TalkerAdapter, TalkerInfo]:
    if source.family != "qwen3_tts":
        raise ValueError(f"talker: model family {source.family!r} is not implemented")
    from voxstage.talker.models.qwen3_tts.adapter import Qwen3TTSAdapter
    from voxstage.talker.models.qwen3_tts.loader import load_qwen3_tts_talker, random_init, read_config
    from voxstage.talker.models.qwen3_tts.tokenizer import QwenTextTokenizer

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
