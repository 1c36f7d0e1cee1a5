"""Stateless overlap+crop re-decoding of the 12 Hz codec: how far from the single-pass decode it lands.

This *reports* the error for left contexts of 25 / 72 / 144 frames (printed, and attached to the test as
properties for the junit report); it asserts only the obvious: more context, less error, and the stateful
stream beats every stateless context on the same chunks.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from services.codec.models.qwen3_tts.decoder import Qwen3TokenizerDecoder
from services.codec.models.qwen3_tts.loader import random_init
from services.codec.models.qwen3_tts.presets import decoder_preset
from services.codec.models.qwen3_tts.stateless import decode_with_left_context, stream_stateless
from services.codec.models.qwen3_tts.streaming import StreamingDecoder

SPF = 1920
FRAMES = 250
CHUNK = 25
# Chunks whose start is past the largest context, so every context size gets its full left context.
MEASURED_STARTS = (150, 175, 200, 225)


@pytest.fixture(scope="module")
def model() -> Qwen3TokenizerDecoder:
    return random_init(decoder_preset("qwen3-tts-tiny"), seed=0)


def test_left_context_error_report(
    model: Qwen3TokenizerDecoder, record_property: Callable[[str, object], None]
) -> None:
    codes = torch.randint(0, 2048, (1, 16, FRAMES), generator=torch.Generator().manual_seed(2))
    with torch.inference_mode():
        offline = model(codes)
    target = torch.cat([offline[:, s * SPF : (s + CHUNK) * SPF] for s in MEASURED_STARTS], dim=-1)

    errors: dict[str, tuple[float, float]] = {}
    for left in (25, 72, 144):
        pieces = [
            decode_with_left_context(model, codes[..., s - left : s], codes[..., s : s + CHUNK])
            for s in MEASURED_STARTS
        ]
        diff = torch.cat(pieces, dim=-1) - target
        errors[f"stateless_L{left}"] = (diff.abs().max().item(), diff.pow(2).mean().sqrt().item())

    dec = StreamingDecoder(model, max_streams=1)
    streamed = torch.cat(
        [dec.decode(codes[..., s : s + CHUNK], torch.tensor([0])) for s in range(0, FRAMES, CHUNK)], -1
    )
    diff = torch.cat([streamed[:, s * SPF : (s + CHUNK) * SPF] for s in MEASURED_STARTS], dim=-1) - target
    errors["stateful"] = (diff.abs().max().item(), diff.pow(2).mean().sqrt().item())

    print(f"\n12 Hz decoder, {CHUNK}-frame chunks, error vs single pass (wav std {offline.std():.3f}):")
    for name, (peak, rms) in errors.items():
        print(f"  {name:14s} max {peak:.3e}  rms {rms:.3e}")
        record_property(f"{name}_max_abs", peak)
        record_property(f"{name}_rms", rms)

    peaks = [errors[k][0] for k in ("stateless_L25", "stateless_L72", "stateless_L144")]
    assert peaks[0] > peaks[1] > peaks[2], peaks
    assert errors["stateful"][0] < peaks[2]


def test_full_left_context_is_exact(model: Qwen3TokenizerDecoder) -> None:
    """With a context that reaches back to frame 0 the crop is the offline prefix: the decoder is causal."""
    codes = torch.randint(0, 2048, (2, 16, 40), generator=torch.Generator().manual_seed(3))
    with torch.inference_mode():
        offline = model(codes)
    cropped = stream_stateless(model, codes, chunk_frames=10, left_context=40)
    assert cropped.shape == offline.shape
    assert (cropped - offline).abs().max().item() <= 1e-5


def test_stateless_rejects_bad_arguments(model: Qwen3TokenizerDecoder) -> None:
    codes = torch.zeros(1, 16, 4, dtype=torch.int64)
    with pytest.raises(ValueError, match="chunk_frames"):
        stream_stateless(model, codes, chunk_frames=0, left_context=2)
    with pytest.raises(ValueError, match="left_context"):
        stream_stateless(model, codes, chunk_frames=2, left_context=-1)
    with pytest.raises(ValueError, match="equal batch and quantizers"):
        decode_with_left_context(model, codes[:, :8], codes)
