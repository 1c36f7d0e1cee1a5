"""Tiny Qwen3-TTS configs and grid-valued random weights for the golden fixtures.

Imported by ``make_golden_qwen3_tts.py`` inside the throwaway reference venv; depends on numpy only.

Every weight is ``q * 2**exp`` with ``q`` an int8 and ``exp`` a per-tensor integer, so the values are exact
in fp32 and bf16 and the stored int8 arrays compress well. Each tensor draws from its own RNG seeded by
(seed, crc32(key)), which keeps a tensor's values independent of how many other keys exist.
"""

from __future__ import annotations

import io
import math
import zipfile
import zlib
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

SEED = 20240611

# Real special ids and a subset of real speakers/languages (models.md §1.3).
CODEC_IDS: dict[str, int] = {
    "codec_pad_id": 2148,
    "codec_bos_id": 2149,
    "codec_eos_token_id": 2150,
    "codec_think_id": 2154,
    "codec_nothink_id": 2155,
    "codec_think_bos_id": 2156,
    "codec_think_eos_id": 2157,
}
LANGUAGES: dict[str, int] = {
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
}
DIALECTS: dict[str, int] = {"sichuan_dialect": 2062, "beijing_dialect": 2074}
SPEAKERS: dict[str, int] = {"ryan": 3061, "vivian": 3065, "eric": 2875}
SPEAKER_DIALECT: dict[str, str | bool] = {"ryan": False, "vivian": False, "eric": "sichuan_dialect"}
TEXT_SPECIAL_IDS: dict[str, int] = {
    "im_start_token_id": 151644,
    "im_end_token_id": 151645,
    "tts_pad_token_id": 151671,
    "tts_bos_token_id": 151672,
    "tts_eos_token_id": 151673,
}


def model_config_kwargs(variant: str) -> dict[str, Any]:
    """Constructor kwargs of ``Qwen3TTSConfig`` for one tiny variant (1.7B-shaped: talker hidden differs
    from the code predictor's, so ``small_to_mtp_projection`` is a real Linear)."""
    custom = variant == "custom_voice"
    talker = {
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "hidden_act": "silu",
        "max_position_embeddings": 32768,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        # Sums to head_dim / 2, as the interleaved MRoPE requires.
        "rope_scaling": {"rope_type": "default", "mrope_section": [4, 2, 2], "interleaved": True},
        "vocab_size": 3072,
        "text_vocab_size": 151936,
        "text_hidden_size": 16,
        "num_code_groups": 16,
        "position_id_per_seconds": 13,
        **CODEC_IDS,
        "codec_language_id": {**LANGUAGES, **(DIALECTS if custom else {})},
        "spk_id": dict(SPEAKERS) if custom else {},
        "spk_is_dialect": dict(SPEAKER_DIALECT) if custom else {},
        "code_predictor_config": {
            "hidden_size": 24,
            "intermediate_size": 48,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 8,
            "hidden_act": "silu",
            "vocab_size": 2048,
            "num_code_groups": 16,
            "max_position_embeddings": 65536,
            "rms_norm_eps": 1e-6,
            "rope_theta": 1000000.0,
        },
    }
    speaker_encoder = {
        "mel_dim": 128,
        "enc_dim": 32,  # must equal the talker hidden size: the x-vector is a talker input embedding
        "enc_channels": [32, 32, 32, 32, 96],
        "enc_kernel_sizes": [5, 3, 3, 3, 1],
        "enc_dilations": [1, 2, 3, 4, 1],
        "enc_attention_channels": 16,
        "enc_res2net_scale": 4,
        "enc_se_channels": 16,
        "sample_rate": 24000,
    }
    return {
        "talker_config": talker,
        "speaker_encoder_config": speaker_encoder,
        "tokenizer_type": "qwen3_tts_tokenizer_12hz",
        "tts_model_size": "1b7",
        "tts_model_type": variant,
        **TEXT_SPECIAL_IDS,
    }


def speech_tokenizer_config_kwargs() -> dict[str, Any]:
    """Constructor kwargs of ``Qwen3TTSTokenizerV2Config``: small dims, real rates (1920 samples/frame),
    real window 72, 16 quantizers of 2048 entries (32 in the Mimi encoder, of which 16 are used)."""
    encoder = {
        "sampling_rate": 24000,
        "frame_rate": 12.5,
        "audio_channels": 1,
        "hidden_size": 32,
        "num_filters": 8,
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
        "codebook_dim": 8,
        "vector_quantization_hidden_dimension": 8,
        "num_quantizers": 32,
        "num_semantic_quantizers": 1,
        "upsample_groups": 32,  # the reference builds (then drops) a grouped upsample: must equal hidden_size
        "num_hidden_layers": 2,
        "intermediate_size": 64,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "hidden_act": "gelu",
        "max_position_embeddings": 8000,
        "norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "sliding_window": 250,
        "layer_scale_initial_scale": 0.01,
    }
    decoder = {
        "codebook_size": 2048,
        "codebook_dim": 16,  # codebook vectors are codebook_dim // 2 = 8 wide
        "hidden_size": 32,
        "latent_dim": 64,
        "head_dim": 32,  # heads * head_dim != hidden_size, as in the released 16 x 64 vs 512
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_quantizers": 16,
        "sliding_window": 72,
        "max_position_embeddings": 8000,
        "rope_theta": 10000.0,
        "rms_norm_eps": 1e-5,
        "layer_scale_initial_scale": 0.01,
        "upsample_rates": [8, 5, 4, 3],
        "upsampling_ratios": [2, 2],
        "decoder_dim": 64,
        "hidden_act": "silu",
    }
    return {
        "encoder_config": encoder,
        "decoder_config": decoder,
        "encoder_valid_num_quantizers": 16,
        "input_sample_rate": 24000,
        "output_sample_rate": 24000,
        "decode_upsample_rate": 1920,
        "encode_downsample_rate": 1920,
    }


GENERATION_CONFIG: dict[str, Any] = {
    # The wrapper's hard defaults (qwen_tts/inference/qwen3_tts_model.py), as the released file carries them.
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


class Grid:
    """Draws int8 grid tensors for one key."""

    def __init__(self, key: str, seed: int = SEED) -> None:
        self.rng = np.random.default_rng([seed, zlib.crc32(key.encode())])

    def normal(self, shape: tuple[int, ...], std: float, levels: int = 8) -> tuple[np.ndarray, int]:
        # levels ~ how many grid steps one std spans: fewer levels -> fewer bits -> smaller fixtures.
        exp = round(math.log2(std / levels))
        q = np.clip(np.rint(self.rng.normal(0.0, std, size=shape) / 2.0**exp), -127, 127)
        return q.astype(np.int8), exp

    def integers(self, shape: tuple[int, ...], low: int, high: int, exp: int) -> tuple[np.ndarray, int]:
        """Uniform q in [low, high] (inclusive), value q * 2**exp."""
        assert -127 <= low <= high <= 127
        return self.rng.integers(low, high + 1, size=shape).astype(np.int8), exp

    def powers_of_two(self, shape: tuple[int, ...], low: int, high: int) -> tuple[np.ndarray, int]:
        """Values 2**k with k uniform in [low, high]: exact divisors, so sum / usage stays exact."""
        k = self.rng.integers(low, high + 1, size=shape)
        return (2 ** (k - low)).astype(np.int8), low


def _fan_in(shape: tuple[int, ...], transposed: bool) -> int:
    if len(shape) == 3:  # conv [out, in/groups, k]; conv-transpose [in, out, k]
        return (shape[0] if transposed else shape[1]) * shape[2]
    return shape[-1]


def _is_norm_weight(key: str) -> bool:
    parts = key.split(".")
    return parts[-1] == "weight" and "norm" in parts[-2]


def draw_tensor(
    key: str, shape: tuple[int, ...], transposed_convs: Iterable[str] = ()
) -> tuple[np.ndarray, int]:
    """Grid values for ``key`` by role. Norm weights stay near 1, layer-scales/ConvNeXt gammas and SnakeBeta
    log-params are made clearly non-default so tests exercise them, codebooks get random centroids (the
    default usage=1/sum=0 decodes to silence)."""
    g = Grid(key)
    name = key.rsplit(".", 1)[-1]
    if name in ("alpha", "beta"):  # SnakeBeta, stored as logs: exp() lands in [0.6, 1.65]
        return g.integers(shape, -8, 8, -4)
    if name in ("scale", "gamma"):  # LayerScale / ConvNeXt gamma: 0.125 .. 1
        return g.integers(shape, 8, 64, -6)
    if name in ("cluster_usage",):
        return g.powers_of_two(shape, -1, 2)
    if name == "initialized":
        return np.ones(shape, dtype=np.int8), 0
    if name in ("embedding_sum", "embed_sum"):
        return g.integers(shape, -8, 8, -3)
    if _is_norm_weight(key):
        return g.integers(shape, 24, 40, -5)  # 0.75 .. 1.25
    if name == "bias":
        return g.normal(shape, 0.1, levels=4)
    if "embedding" in key:  # token embedding tables feed the residual stream directly
        return g.normal(shape, 1.0, levels=4)
    transposed = any(key.startswith(p) for p in transposed_convs)
    std = 1.0 / math.sqrt(_fan_in(shape, transposed))
    big = math.prod(shape) >= 32768  # codec heads, code-predictor heads: keep them cheap to store
    return g.normal(shape, std, levels=4 if big else 8)


def draw_state(
    shapes: Mapping[str, tuple[int, ...]], transposed_convs: Iterable[str] = ()
) -> dict[str, tuple[np.ndarray, int]]:
    prefixes = tuple(transposed_convs)
    return {key: draw_tensor(key, tuple(shape), prefixes) for key, shape in shapes.items()}


def write_npz(path: str, arrays: Mapping[str, np.ndarray]) -> None:
    """A compressed .npz with fixed timestamps and sorted members, so reruns give identical bytes
    (``np.savez_compressed`` stamps the current time into the zip)."""
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=9) as zf:
        for name in sorted(arrays):
            buf = io.BytesIO()
            np.lib.format.write_array(buf, np.ascontiguousarray(arrays[name]), allow_pickle=False)
            info = zipfile.ZipInfo(name + ".npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            zf.writestr(info, buf.getvalue(), compresslevel=9)
