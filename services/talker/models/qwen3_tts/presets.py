"""Talker-side presets: ``config.json`` / ``generation_config.json`` dicts in the real checkpoint layout.

* ``qwen3-tts-tiny``: the real architecture at toy width (talker 64 != predictor 48, so the
  ``small_to_mtp_projection`` path is exercised), real vocabularies and special ids; random weights.
* ``qwen3-tts-0.6b`` / ``qwen3-tts-1.7b``: size-true configs of the released checkpoints (models.md §1.3),
  for GPU benchmarks with random weights; never materialized on CPU.

The speech-tokenizer part of a preset and the speaker encoder's internals belong to the codec stage; the
``speaker_encoder_config`` written here only pins ``enc_dim`` (it must equal the talker hidden size).
"""

from __future__ import annotations

import copy
from typing import Any

from .config import TTSModelType

PRESETS: tuple[str, ...] = ("qwen3-tts-tiny", "qwen3-tts-0.6b", "qwen3-tts-1.7b")

CODEC_LANGUAGE_ID: dict[str, int] = {
    "english": 2050,
    "german": 2053,
    "spanish": 2054,
    "chinese": 2055,
    "japanese": 2058,
    "french": 2061,
    "korean": 2064,
    "russian": 2069,
    "italian": 2070,
    "portuguese": 2071,
    "sichuan_dialect": 2062,
    "beijing_dialect": 2074,
}
SPEAKER_ID: dict[str, int] = {
    "serena": 3066,
    "vivian": 3065,
    "uncle_fu": 3010,
    "ryan": 3061,
    "aiden": 2861,
    "ono_anna": 2873,
    "sohee": 2864,
    "eric": 2875,
    "dylan": 2878,
}
SPEAKER_DIALECT: dict[str, str | bool] = {name: False for name in SPEAKER_ID} | {
    "eric": "sichuan_dialect",
    "dylan": "beijing_dialect",
}
CODEC_SPECIAL_IDS: dict[str, int] = {
    "codec_pad_id": 2148,
    "codec_bos_id": 2149,
    "codec_eos_token_id": 2150,
    "codec_think_id": 2154,
    "codec_nothink_id": 2155,
    "codec_think_bos_id": 2156,
    "codec_think_eos_id": 2157,
}

# Per size: talker dims, code-predictor dims, interleaved MRoPE sections (sum = head_dim / 2).
_SIZES: dict[str, dict[str, Any]] = {
    "qwen3-tts-tiny": {
        "size": "tiny",
        "talker": dict(
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            text_hidden_size=32,
            max_position_embeddings=4096,
        ),
        "mrope_section": [4, 2, 2],
        "predictor": dict(
            hidden_size=48,
            intermediate_size=96,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=12,
            max_position_embeddings=64,
        ),
    },
    "qwen3-tts-0.6b": {
        "size": "0b6",
        "talker": dict(
            hidden_size=1024,
            intermediate_size=3072,
            num_hidden_layers=28,
            num_attention_heads=16,
            num_key_value_heads=8,
            head_dim=128,
            text_hidden_size=2048,
            max_position_embeddings=32768,
        ),
        "mrope_section": [24, 20, 20],
        "predictor": dict(
            hidden_size=1024,
            intermediate_size=3072,
            num_hidden_layers=5,
            num_attention_heads=16,
            num_key_value_heads=8,
            head_dim=128,
            max_position_embeddings=65536,
        ),
    },
    "qwen3-tts-1.7b": {
        "size": "1b7",
        "talker": dict(
            hidden_size=2048,
            intermediate_size=6144,
            num_hidden_layers=28,
            num_attention_heads=16,
            num_key_value_heads=8,
            head_dim=128,
            text_hidden_size=2048,
            max_position_embeddings=32768,
        ),
        "mrope_section": [24, 20, 20],
        "predictor": dict(
            hidden_size=1024,
            intermediate_size=3072,
            num_hidden_layers=5,
            num_attention_heads=16,
            num_key_value_heads=8,
            head_dim=128,
            max_position_embeddings=65536,
        ),
    },
}


def preset_config(name: str, variant: TTSModelType) -> dict[str, Any]:
    """``config.json`` of preset ``name`` for ``variant`` (talker fields + ``speaker_encoder_config``)."""
    if name not in _SIZES:
        raise ValueError(f"unknown preset {name!r}; known presets: {', '.join(PRESETS)}")
    if variant not in ("base", "custom_voice", "voice_design"):
        raise ValueError(f"variant must be base, custom_voice or voice_design, got {variant!r}")
    if name == "qwen3-tts-0.6b" and variant == "voice_design":
        raise ValueError(
            "Qwen3-TTS VoiceDesign is released at 1.7B only; use qwen3-tts-1.7b or qwen3-tts-tiny"
        )
    spec = copy.deepcopy(_SIZES[name])
    custom = variant == "custom_voice"
    talker = {
        "model_type": "qwen3_tts_talker",
        **spec["talker"],
        "vocab_size": 3072,
        "text_vocab_size": 151936,
        "num_code_groups": 16,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "rope_scaling": {"rope_type": "default", "mrope_section": spec["mrope_section"], "interleaved": True},
        "attention_bias": False,
        "use_sliding_window": False,
        "position_id_per_seconds": 13,
        **CODEC_SPECIAL_IDS,
        "codec_language_id": dict(CODEC_LANGUAGE_ID),
        "spk_id": dict(SPEAKER_ID) if custom else {},
        "spk_is_dialect": dict(SPEAKER_DIALECT) if custom else {},
        "code_predictor_config": {
            "model_type": "qwen3_tts_talker_code_predictor",
            **spec["predictor"],
            "vocab_size": 2048,
            "num_code_groups": 16,
            "hidden_act": "silu",
            "rms_norm_eps": 1e-6,
            "rope_theta": 1000000.0,
            "rope_scaling": None,
            "attention_bias": False,
            "use_sliding_window": False,
        },
    }
    config: dict[str, Any] = {
        "architectures": ["Qwen3TTSForConditionalGeneration"],
        "model_type": "qwen3_tts",
        "tts_model_type": variant,
        "tts_model_size": spec["size"],
        "tokenizer_type": "qwen3_tts_tokenizer_12hz",
        "im_start_token_id": 151644,
        "im_end_token_id": 151645,
        "tts_pad_token_id": 151671,
        "tts_bos_token_id": 151672,
        "tts_eos_token_id": 151673,
        "talker_config": talker,
    }
    if variant == "base":
        config["speaker_encoder_config"] = {"enc_dim": spec["talker"]["hidden_size"], "sample_rate": 24000}
    return config


def preset_generation_config() -> dict[str, Any]:
    """``generation_config.json`` with the released sampling defaults."""
    return {
        "do_sample": True,
        "top_k": 50,
        "top_p": 1.0,
        "temperature": 0.9,
        "repetition_penalty": 1.05,
        "subtalker_dosample": True,
        "subtalker_top_k": 50,
        "subtalker_top_p": 1.0,
        "subtalker_temperature": 0.9,
        "max_new_tokens": 8192,
    }
