"""Configuration of the Qwen3-TTS 12 Hz tokenizer *encoder* (a Mimi encoder, HF-4.57 ``MimiConfig`` fields).

The speech tokenizer's ``config.json`` carries it as ``encoder_config``. Missing fields take the
``MimiConfig`` defaults, exactly as the reference's ``MimiConfig(**encoder_config)`` would; fields that only
the (deleted) Mimi decoder reads are accepted and ignored. Values the encoder cannot honour fail with an
error naming the field.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from voxstage.checkpoint import CheckpointError

# MimiConfig defaults (transformers 4.57) for every field the encoder reads.
_MIMI_DEFAULTS: dict[str, Any] = {
    "sampling_rate": 24_000,
    "frame_rate": None,
    "audio_channels": 1,
    "hidden_size": 512,
    "num_filters": 64,
    "num_residual_layers": 1,
    "upsampling_ratios": [8, 6, 5, 4],
    "kernel_size": 7,
    "last_kernel_size": 3,
    "residual_kernel_size": 3,
    "dilation_growth_rate": 2,
    "use_causal_conv": True,
    "pad_mode": "constant",
    "compress": 2,
    "codebook_size": 2048,
    "codebook_dim": 256,
    "num_quantizers": 32,
    "use_conv_shortcut": False,
    "vector_quantization_hidden_dimension": 256,
    "num_semantic_quantizers": 1,
    "num_hidden_layers": 8,
    "intermediate_size": 2048,
    "num_attention_heads": 8,
    "num_key_value_heads": 8,
    "head_dim": None,
    "hidden_act": "gelu",
    "max_position_embeddings": 8000,
    "norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "sliding_window": 250,
    "layer_scale_initial_scale": 0.01,
    "attention_bias": False,
}

SUPPORTED_ACTIVATIONS = ("gelu", "gelu_pytorch_tanh", "gelu_new")
SUPPORTED_PAD_MODES = ("constant", "replicate")


@dataclass(frozen=True)
class EncoderConfig:
    sampling_rate: int
    frame_rate: float
    hidden_size: int
    num_filters: int
    num_residual_layers: int
    upsampling_ratios: tuple[int, ...]
    kernel_size: int
    last_kernel_size: int
    residual_kernel_size: int
    dilation_growth_rate: int
    pad_mode: str
    compress: int
    use_conv_shortcut: bool
    codebook_size: int
    codebook_dim: int
    num_quantizers: int
    num_semantic_quantizers: int
    vq_hidden_size: int
    num_hidden_layers: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    hidden_act: str
    norm_eps: float
    rope_theta: float
    sliding_window: int
    layer_scale_initial_scale: float
    attention_bias: bool
    # Top-level speech-tokenizer fields: how many quantizers the released model actually uses, and the
    # samples per code frame used to cut the codes of a padded clip.
    valid_num_quantizers: int = 16
    downsample_rate: int = 1920

    @property
    def seanet_rate(self) -> int:
        """Frames per second after the SEANet convs (Mimi's ``encodec_frame_rate``)."""
        return math.ceil(self.sampling_rate / math.prod(self.upsampling_ratios))

    @property
    def downsample_kernel(self) -> int:
        return 2 * int(self.seanet_rate / self.frame_rate)

    @property
    def samples_per_frame(self) -> int:
        return math.prod(self.upsampling_ratios) * 2

    @classmethod
    def from_dict(
        cls,
        raw: Mapping[str, Any],
        *,
        valid_num_quantizers: int = 16,
        downsample_rate: int = 1920,
        source: str = "encoder_config",
    ) -> EncoderConfig:
        if not isinstance(raw, Mapping):
            raise CheckpointError(f"{source} must be a JSON object, got {type(raw).__name__}")
        v = {**_MIMI_DEFAULTS, **{k: raw[k] for k in raw if k in _MIMI_DEFAULTS}}
        if v["frame_rate"] is None and raw.get("_frame_rate") is not None:
            v["frame_rate"] = raw["_frame_rate"]

        def _int(key: str, minimum: int = 1) -> int:
            val = v[key]
            if isinstance(val, bool) or not isinstance(val, int) or val < minimum:
                raise CheckpointError(f"{source}.{key} must be an integer >= {minimum}, got {val!r}")
            return val

        def _float(key: str) -> float:
            val = v[key]
            if isinstance(val, bool) or not isinstance(val, int | float) or not (0 < val < math.inf):
                raise CheckpointError(f"{source}.{key} must be a positive number, got {val!r}")
            return float(val)

        def _bool(key: str) -> bool:
            if not isinstance(v[key], bool):
                raise CheckpointError(f"{source}.{key} must be true or false, got {v[key]!r}")
            return v[key]

        ratios = v["upsampling_ratios"]
        if (
            not isinstance(ratios, list | tuple)
            or not ratios
            or not all(isinstance(r, int) and not isinstance(r, bool) and r >= 1 for r in ratios)
        ):
            raise CheckpointError(
                f"{source}.upsampling_ratios must be a non-empty list of positive ints, got {ratios!r}"
            )
        if _int("audio_channels") != 1:
            raise CheckpointError(
                f"{source}.audio_channels must be 1 (mono reference audio), got {v['audio_channels']}"
            )
        if not _bool("use_causal_conv"):
            raise CheckpointError(f"{source}.use_causal_conv must be true: the Qwen3-TTS encoder is causal")
        if v["pad_mode"] not in SUPPORTED_PAD_MODES:
            raise CheckpointError(
                f"{source}.pad_mode must be one of {SUPPORTED_PAD_MODES}, got {v['pad_mode']!r}"
            )
        if v["hidden_act"] not in SUPPORTED_ACTIVATIONS:
            raise CheckpointError(
                f"{source}.hidden_act must be one of {SUPPORTED_ACTIVATIONS}, got {v['hidden_act']!r}"
            )

        hidden, heads = _int("hidden_size"), _int("num_attention_heads")
        kv_heads = _int("num_key_value_heads")
        head_dim = v["head_dim"] if v["head_dim"] is not None else hidden // heads
        if isinstance(head_dim, bool) or not isinstance(head_dim, int) or head_dim < 2 or head_dim % 2:
            raise CheckpointError(f"{source}.head_dim must be an even integer >= 2, got {head_dim!r}")
        if heads % kv_heads:
            raise CheckpointError(
                f"{source}.num_attention_heads ({heads}) must be a multiple of "
                f"num_key_value_heads ({kv_heads})"
            )
        sampling_rate = _int("sampling_rate")
        frame_rate = (
            sampling_rate / (math.prod(ratios) * 2) if v["frame_rate"] is None else _float("frame_rate")
        )
        num_q, num_sem = _int("num_quantizers"), _int("num_semantic_quantizers")
        if num_sem >= num_q:
            raise CheckpointError(
                f"{source}.num_semantic_quantizers ({num_sem}) must be < num_quantizers ({num_q})"
            )
        if not num_sem <= valid_num_quantizers <= num_q:
            raise CheckpointError(
                f"encoder_valid_num_quantizers ({valid_num_quantizers}) must lie in "
                f"[{num_sem}, {num_q}] (the semantic and total quantizer counts)"
            )
        cfg = cls(
            sampling_rate=sampling_rate,
            frame_rate=frame_rate,
            hidden_size=hidden,
            num_filters=_int("num_filters"),
            num_residual_layers=_int("num_residual_layers"),
            upsampling_ratios=tuple(ratios),
            kernel_size=_int("kernel_size"),
            last_kernel_size=_int("last_kernel_size"),
            residual_kernel_size=_int("residual_kernel_size"),
            dilation_growth_rate=_int("dilation_growth_rate"),
            pad_mode=v["pad_mode"],
            compress=_int("compress"),
            use_conv_shortcut=_bool("use_conv_shortcut"),
            codebook_size=_int("codebook_size"),
            codebook_dim=_int("codebook_dim"),
            num_quantizers=num_q,
            num_semantic_quantizers=num_sem,
            vq_hidden_size=_int("vector_quantization_hidden_dimension"),
            num_hidden_layers=_int("num_hidden_layers", minimum=0),
            intermediate_size=_int("intermediate_size"),
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            head_dim=head_dim,
            hidden_act=v["hidden_act"],
            norm_eps=_float("norm_eps"),
            rope_theta=_float("rope_theta"),
            sliding_window=_int("sliding_window"),
            layer_scale_initial_scale=_float("layer_scale_initial_scale"),
            attention_bias=_bool("attention_bias"),
            valid_num_quantizers=valid_num_quantizers,
            downsample_rate=downsample_rate,
        )
        if cfg.seanet_rate == cfg.frame_rate or cfg.downsample_kernel < 2:
            raise CheckpointError(
                f"{source}: frame_rate {frame_rate} must be half the SEANet rate {cfg.seanet_rate} "
                "(the encoder ends in a stride-2 downsample conv)"
            )
        if cfg.vq_hidden_size != cfg.codebook_dim:
            raise CheckpointError(
                f"{source}.vector_quantization_hidden_dimension ({cfg.vq_hidden_size}) must equal "
                f"codebook_dim ({cfg.codebook_dim}): codebook vectors live in the projected space"
            )
        if cfg.samples_per_frame != downsample_rate:
            raise CheckpointError(
                f"encode_downsample_rate ({downsample_rate}) does not match the encoder's "
                f"{cfg.samples_per_frame} samples per frame (prod(upsampling_ratios) * 2)"
            )
        return cfg


def _mimi_encoder_dict(**overrides: Any) -> dict[str, Any]:
    cfg = {"model_type": "mimi", **_MIMI_DEFAULTS, "frame_rate": 12.5}
    cfg.update(overrides)
    return cfg


def real_encoder_config() -> dict[str, Any]:
    """``encoder_config`` of the released Qwen3-TTS-Tokenizer-12Hz (models.md §1.3)."""
    return _mimi_encoder_dict(
        hidden_size=512,
        num_hidden_layers=8,
        num_attention_heads=8,
        num_key_value_heads=8,
        head_dim=64,
        intermediate_size=2048,
        num_filters=64,
        codebook_size=2048,
        codebook_dim=256,
        vector_quantization_hidden_dimension=256,
        num_quantizers=32,
        upsample_groups=512,
        sliding_window=250,
    )


def tiny_encoder_config() -> dict[str, Any]:
    """A small encoder with the real structure (same strides, so 1920 samples per frame and 32 quantizers)."""
    return _mimi_encoder_dict(
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=16,
        intermediate_size=64,
        num_filters=8,
        codebook_size=2048,
        codebook_dim=16,
        vector_quantization_hidden_dimension=16,
        num_quantizers=32,
        upsample_groups=32,
    )
