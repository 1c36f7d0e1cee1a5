"""Speech-tokenizer side of the Qwen3-TTS presets: ``speech_tokenizer/config.json`` dicts.

Preset names match the talker's (``services.talker.models.qwen3_tts.presets.PRESETS``):

* ``qwen3-tts-tiny``: small dims with the real rates (1920 samples per frame, 16 x 2048 codebooks, window 72)
  so it runs fast on CPU yet streams exactly like the released codec;
* ``qwen3-tts-0.6b`` / ``qwen3-tts-1.7b``: both models ship the same 12 Hz tokenizer; its ``decoder_config``
  (models.md §1.3) builds the 114 M-parameter decoder, so GPU benchmarks see real FLOPs and bytes.

This module owns ``decoder_config`` and the top-level fields; ``encoder_config`` comes from the encoder's
own preset functions.
"""

from __future__ import annotations

import copy
from typing import Any

from .config import MODEL_TYPE, Qwen3DecoderConfig

SPEECH_TOKENIZER_PRESETS: tuple[str, ...] = ("qwen3-tts-tiny", "qwen3-tts-0.6b", "qwen3-tts-1.7b")

_TOP_LEVEL: dict[str, Any] = {
    "model_type": MODEL_TYPE,
    "architectures": ["Qwen3TTSTokenizerV2Model"],
    "encoder_valid_num_quantizers": 16,
    "input_sample_rate": 24000,
    "output_sample_rate": 24000,
    "decode_upsample_rate": 1920,
    "encode_downsample_rate": 1920,
}

# Released values; the file also lists encoder-side fields the decoder ignores (kept for layout fidelity).
_REAL_DECODER: dict[str, Any] = Qwen3DecoderConfig().to_dict() | {
    "semantic_codebook_size": 4096,
    "vector_quantization_hidden_dimension": 512,
    "attention_dropout": 0.0,
}

# Same shape as the golden fixtures' decoder: heads * head_dim (64) != hidden_size (32), as in the released
# 16 x 64 vs 512, so the projection shapes are exercised.
_TINY_DECODER: dict[str, Any] = Qwen3DecoderConfig(
    codebook_dim=16,
    latent_dim=64,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=2,
    head_dim=32,
    decoder_dim=64,
).to_dict()


def _encoder_config(tiny: bool) -> dict[str, Any]:
    # The encoder side owns these dicts. Imported lazily and from its config module, not encoder.py, so
    # building a decoder preset never pulls in the encoder's audio dependencies (resampling, mel).
    from .encoder_config import real_encoder_config, tiny_encoder_config

    return tiny_encoder_config() if tiny else real_encoder_config()


def speech_tokenizer_config(preset: str) -> dict[str, Any]:
    """The whole ``speech_tokenizer/config.json`` object of ``preset`` (a fresh copy each call)."""
    if preset not in SPEECH_TOKENIZER_PRESETS:
        raise ValueError(f"unknown preset {preset!r}; known presets: {', '.join(SPEECH_TOKENIZER_PRESETS)}")
    tiny = preset == "qwen3-tts-tiny"
    config = copy.deepcopy(_TOP_LEVEL)
    config["encoder_config"] = _encoder_config(tiny)
    config["decoder_config"] = copy.deepcopy(_TINY_DECODER if tiny else _REAL_DECODER)
    return config


def decoder_preset(preset: str) -> Qwen3DecoderConfig:
    """The typed decoder config of ``preset`` (without building the encoder part)."""
    if preset not in SPEECH_TOKENIZER_PRESETS:
        raise ValueError(f"unknown preset {preset!r}; known presets: {', '.join(SPEECH_TOKENIZER_PRESETS)}")
    return Qwen3DecoderConfig.from_dict(_TINY_DECODER if preset == "qwen3-tts-tiny" else _REAL_DECODER)
