"""Typed config of the Qwen3-TTS 12 Hz tokenizer decoder, read from ``speech_tokenizer/config.json``.

Only ``decoder_config`` and the top-level rates are parsed here; ``encoder_config`` belongs to the encoder.
Absent optional fields take the reference class defaults (qwen-tts 0.1.1), so a released config and a
minimal hand-written one parse the same way. Every error names the offending field.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

MODEL_TYPE = "qwen3_tts_tokenizer_12hz"


class DecoderConfigError(ValueError):
    """``speech_tokenizer/config.json`` is missing a field or holds a bad value."""


def _int(d: Mapping[str, Any], key: str, where: str, default: int | None = None, minimum: int = 1) -> int:
    if key not in d:
        if default is None:
            raise DecoderConfigError(f"{where}.{key} is required")
        return default
    value = d[key]
    if isinstance(value, bool) or not isinstance(value, int):
        raise DecoderConfigError(f"{where}.{key} must be an integer, got {value!r}")
    if value < minimum:
        raise DecoderConfigError(f"{where}.{key} must be >= {minimum}, got {value}")
    return value


def _float(d: Mapping[str, Any], key: str, where: str, default: float, positive: bool = True) -> float:
    value = d.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise DecoderConfigError(f"{where}.{key} must be a number, got {value!r}")
    if positive and value <= 0:
        raise DecoderConfigError(f"{where}.{key} must be > 0, got {value}")
    return float(value)


def _int_list(d: Mapping[str, Any], key: str, where: str, default: tuple[int, ...]) -> tuple[int, ...]:
    value = d.get(key, list(default))
    if not isinstance(value, list | tuple) or not value:
        raise DecoderConfigError(f"{where}.{key} must be a non-empty list of integers, got {value!r}")
    for item in value:
        if isinstance(item, bool) or not isinstance(item, int) or item < 1:
            raise DecoderConfigError(f"{where}.{key} must hold positive integers, got {value!r}")
    return tuple(value)


@dataclass(frozen=True)
class Qwen3DecoderConfig:
    """``decoder_config`` plus the top-level sample rate; field names follow the checkpoint's JSON."""

    codebook_size: int = 2048
    codebook_dim: int = 512
    latent_dim: int = 1024
    hidden_size: int = 512
    intermediate_size: int = 1024
    num_hidden_layers: int = 8
    num_attention_heads: int = 16
    num_key_value_heads: int = 16
    head_dim: int = 64
    sliding_window: int = 72
    max_position_embeddings: int = 8000
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    layer_scale_initial_scale: float = 0.01
    attention_bias: bool = False
    num_quantizers: int = 16
    decoder_dim: int = 1536
    upsample_rates: tuple[int, ...] = (8, 5, 4, 3)
    upsampling_ratios: tuple[int, ...] = (2, 2)
    output_sample_rate: int = 24000

    def __post_init__(self) -> None:
        where = "decoder_config"
        if self.codebook_dim % 2:
            raise DecoderConfigError(f"{where}.codebook_dim must be even (codebooks are codebook_dim/2 wide)")
        if self.num_attention_heads % self.num_key_value_heads:
            raise DecoderConfigError(
                f"{where}.num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads})"
            )
        if self.head_dim % 2:
            raise DecoderConfigError(f"{where}.head_dim must be even for rotary embeddings")
        if self.decoder_dim % (2 ** len(self.upsample_rates)):
            raise DecoderConfigError(
                f"{where}.decoder_dim ({self.decoder_dim}) must be divisible by 2**len(upsample_rates)"
            )

    @property
    def codebook_vector_dim(self) -> int:
        """Width of one codebook entry: the split RVQ works at half of ``codebook_dim``."""
        return self.codebook_dim // 2

    @property
    def samples_per_frame(self) -> int:
        return math.prod(self.upsample_rates) * math.prod(self.upsampling_ratios)

    @property
    def frame_rate(self) -> float:
        return self.output_sample_rate / self.samples_per_frame

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], *, output_sample_rate: int = 24000) -> Qwen3DecoderConfig:
        """Parse a ``decoder_config`` mapping; unknown keys (transformers metadata, encoder-only
        fields such as ``semantic_codebook_size``) are ignored because the decoder does not use them."""
        w = "decoder_config"
        if not isinstance(d, Mapping):
            raise DecoderConfigError(f"{w} must be a JSON object, got {type(d).__name__}")
        act = d.get("hidden_act", "silu")
        if act != "silu":
            raise DecoderConfigError(f"{w}.hidden_act must be 'silu' (the decoder's only MLP), got {act!r}")
        scaling = d.get("rope_scaling")
        if scaling not in (None, {}) and (
            not isinstance(scaling, Mapping) or scaling.get("rope_type", scaling.get("type")) != "default"
        ):
            raise DecoderConfigError(f"{w}.rope_scaling: only default RoPE is supported, got {scaling!r}")
        bias = d.get("attention_bias", False)
        if not isinstance(bias, bool):
            raise DecoderConfigError(f"{w}.attention_bias must be a boolean, got {bias!r}")
        # The reference always splits the RVQ as 1 semantic + the rest, whatever the file says.
        if d.get("num_semantic_quantizers", 1) != 1:
            got = d["num_semantic_quantizers"]
            raise DecoderConfigError(f"{w}.num_semantic_quantizers must be 1, got {got!r}")
        heads = _int(d, "num_attention_heads", w, 16)
        hidden = _int(d, "hidden_size", w, 1024)
        return cls(
            codebook_size=_int(d, "codebook_size", w, 2048),
            # The reference config class has no default for codebook_dim: it must be present.
            codebook_dim=_int(d, "codebook_dim", w),
            latent_dim=_int(d, "latent_dim", w, 1024),
            hidden_size=hidden,
            intermediate_size=_int(d, "intermediate_size", w, 3072),
            num_hidden_layers=_int(d, "num_hidden_layers", w, 8),
            num_attention_heads=heads,
            num_key_value_heads=_int(d, "num_key_value_heads", w, 16),
            head_dim=_int(d, "head_dim", w, hidden // heads if hidden % heads == 0 else None),
            sliding_window=_int(d, "sliding_window", w, 72),
            max_position_embeddings=_int(d, "max_position_embeddings", w, 8000),
            rope_theta=_float(d, "rope_theta", w, 10000.0),
            rms_norm_eps=_float(d, "rms_norm_eps", w, 1e-5),
            layer_scale_initial_scale=_float(d, "layer_scale_initial_scale", w, 0.01),
            attention_bias=bias,
            num_quantizers=_int(d, "num_quantizers", w, 16, minimum=2),
            decoder_dim=_int(d, "decoder_dim", w, 1536),
            upsample_rates=_int_list(d, "upsample_rates", w, (8, 5, 4, 3)),
            upsampling_ratios=_int_list(d, "upsampling_ratios", w, (2, 2)),
            output_sample_rate=output_sample_rate,
        )

    def to_dict(self) -> dict[str, Any]:
        """The ``decoder_config`` JSON object (reference field names) that parses back to ``self``."""
        return {
            "codebook_size": self.codebook_size,
            "codebook_dim": self.codebook_dim,
            "latent_dim": self.latent_dim,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "sliding_window": self.sliding_window,
            "max_position_embeddings": self.max_position_embeddings,
            "rope_theta": self.rope_theta,
            "rms_norm_eps": self.rms_norm_eps,
            "layer_scale_initial_scale": self.layer_scale_initial_scale,
            "attention_bias": self.attention_bias,
            "hidden_act": "silu",
            "num_quantizers": self.num_quantizers,
            "num_semantic_quantizers": 1,
            "decoder_dim": self.decoder_dim,
            "upsample_rates": list(self.upsample_rates),
            "upsampling_ratios": list(self.upsampling_ratios),
        }


def decoder_config_from_tokenizer_json(data: Mapping[str, Any]) -> Qwen3DecoderConfig:
    """Parse the whole ``speech_tokenizer/config.json`` object: ``decoder_config`` and the top-level rates.

    ``decode_upsample_rate`` must agree with the product of the decoder's upsampling factors, or the
    wrapper's per-frame sample count would disagree with what the network emits.
    """
    model_type = data.get("model_type", MODEL_TYPE)
    if model_type != MODEL_TYPE:
        raise DecoderConfigError(f"model_type must be {MODEL_TYPE!r}, got {model_type!r}")
    if "decoder_config" not in data:
        raise DecoderConfigError("decoder_config is required")
    rate = _int(data, "output_sample_rate", "speech_tokenizer config", 24000)
    cfg = Qwen3DecoderConfig.from_dict(data["decoder_config"], output_sample_rate=rate)
    upsample = _int(data, "decode_upsample_rate", "speech_tokenizer config", cfg.samples_per_frame)
    if upsample != cfg.samples_per_frame:
        raise DecoderConfigError(
            f"decode_upsample_rate is {upsample} but decoder_config.upsample_rates x upsampling_ratios "
            f"give {cfg.samples_per_frame} samples per frame"
        )
    return cfg
