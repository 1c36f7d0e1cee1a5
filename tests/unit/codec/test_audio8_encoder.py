"""The Audio8 encode half (voice-clone reference audio): frame count, code ranges, determinism, the
cosine/residual lookups against a plain reading, and resampling of non-44.1 kHz input.

Frame count: the clip is right-padded with zeros to a whole number of 2048-sample frames before encoding
(as the reference does), so S samples give ``ceil(S / 2048)`` frames.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import soxr
import torch
import torch.nn.functional as F

from services.codec.models.audio8_tts.codec import Audio8Codec
from services.codec.models.audio8_tts.config import Audio8CodecConfig
from services.codec.models.audio8_tts.loader import random_init
from services.codec.models.audio8_tts.reference_audio import ReferenceAudioError


@pytest.fixture(scope="module")
def model() -> Audio8Codec:
    return random_init(Audio8CodecConfig.tiny(), seed=1)


def _pcm(seed: int, samples: int, rate: int = 44100) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(samples) / rate
    tone = 0.3 * np.sin(2 * np.pi * 220 * t) * (0.6 + 0.4 * np.sin(2 * np.pi * 3 * t))
    return (tone + 0.05 * rng.standard_normal(samples)).astype(np.float32)


@pytest.mark.parametrize("samples", [1, 2047, 2048, 2049, 44100])
def test_frame_count_is_ceil(model: Audio8Codec, samples: int) -> None:
    codes = model.encode(torch.from_numpy(_pcm(0, samples))[None])
    assert codes.shape == (1, 10, math.ceil(samples / 2048)) == (1, 10, model.num_frames(samples))
    assert codes.dtype == torch.int64


def test_codes_in_range_deterministic_and_input_dependent(model: Audio8Codec) -> None:
    pcm = torch.from_numpy(np.stack([_pcm(1, 3 * 44100), _pcm(2, 3 * 44100)]))
    codes = model.encode(pcm)
    assert codes.shape == (2, 10, 65)
    assert codes.min() >= 0 and codes[:, 0].max() < 4096 and codes[:, 1:].max() < 1024
    assert codes[:, 0].max() >= 1024, "the semantic codebook has 4096 entries, not 1024"
    assert torch.equal(model.encode(pcm), codes)
    assert not torch.equal(codes[0], codes[1])
    # Batch rows are independent: encoding one alone gives its row.
    assert torch.equal(model.encode(pcm[1:]), codes[1:])


def test_quantizer_matches_plain_lookup(model: Audio8Codec) -> None:
    """Semantic code = cosine nearest neighbour of in_proj(z) over 4096 entries; residual code k =
    cosine nearest neighbour of in_proj_k(z - sum of earlier quantized vectors)."""
    sd = model.state_dict()
    pcm = torch.from_numpy(_pcm(3, 2 * 44100))[None]
    codes = model.encode(pcm)
    with torch.inference_mode():
        x = F.pad(pcm[:, None], (0, codes.shape[-1] * 2048 - pcm.shape[-1]))
        z = model.encoder(x)
        for conv, convnext in model.quantizer.downsample:
            z = convnext(conv(z))
        z = model.quantizer.pre_module(z)[0].T  # [T, latent]

    def lookup(prefix: str, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        w_in = sd[f"{prefix}.in_proj.weight"][:, :, 0]
        proj = target @ w_in.T + sd[f"{prefix}.in_proj.bias"]
        table = sd[f"{prefix}.codebook.weight"]
        cos = (proj / proj.norm(dim=-1, keepdim=True)) @ (table / table.norm(dim=-1, keepdim=True)).T
        idx = cos.argmax(-1)
        vec = table[idx] @ sd[f"{prefix}.out_proj.weight"][:, :, 0].T + sd[f"{prefix}.out_proj.bias"]
        return idx, vec

    idx, vec = lookup("quantizer.semantic_quantizer.quantizers.0", z)
    assert torch.equal(idx, codes[0, 0])
    residual = z - vec
    for k in range(9):
        idx, vec = lookup(f"quantizer.quantizer.quantizers.{k}", residual)
        assert torch.equal(idx, codes[0, 1 + k]), f"residual codebook {k}"
        residual = residual - vec


def test_reference_at_24k_is_resampled(model: Audio8Codec) -> None:
    clip = _pcm(4, 24000, rate=24000)
    codes = model.encode_reference(clip, 24000)
    assert codes.shape == (10, math.ceil(44100 / 2048)) and codes.dtype == torch.int64
    assert codes.device.type == "cpu"
    resampled = soxr.resample(clip, 24000, 44100, quality="HQ")[:44100]
    assert torch.equal(codes, model.encode(torch.from_numpy(resampled)[None])[0])
    # Stereo [samples, channels] is mixed to mono; a tensor works like an array.
    stereo = np.stack([clip, clip], axis=1)
    assert torch.equal(model.encode_reference(torch.from_numpy(stereo), 24000), codes)


@pytest.mark.parametrize(
    "pcm,rate,match",
    [
        (np.zeros(0, np.float32), 44100, "empty"),
        (np.zeros(100, np.int16), 44100, "float PCM"),
        (np.zeros(100, np.float32), 0, "sample_rate"),
        (np.full(100, np.nan, np.float32), 44100, "NaN"),
        (np.zeros((2, 100), np.float32), 44100, r"\[samples\]"),
        (np.zeros(61 * 16000, np.float32), 16000, "limit"),
    ],
)
def test_bad_reference_audio_raises(model: Audio8Codec, pcm: np.ndarray, rate: int, match: str) -> None:
    with pytest.raises(ReferenceAudioError, match=match):
        model.encode_reference(pcm, rate)
