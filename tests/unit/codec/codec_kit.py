"""Deterministic inputs and checks shared by the codec tests."""

from __future__ import annotations

from collections.abc import Callable

import torch

SPF = 1920  # samples per 12.5 Hz frame at 24 kHz (both codecs)


def random_codes(seed: int, frames: int, batch: int = 1, groups: int = 16, size: int = 2048) -> torch.Tensor:
    """``[batch, groups, frames]`` codes in [0, size)."""
    return torch.randint(0, size, (batch, groups, frames), generator=torch.Generator().manual_seed(seed))


def audio8_codes(seed: int, frames: int, batch: int = 1) -> torch.Tensor:
    """``[batch, 10, frames]`` Audio8 codes over the talker's full range [0, 4096) (residual codes above
    1023 included: the codec clamps them)."""
    return random_codes(seed, frames, batch, groups=10, size=4096)


def offline_reference(
    model: Callable[[torch.Tensor], torch.Tensor], codes: torch.Tensor, spf: int, limit: float
) -> torch.Tensor:
    """The single-pass decode a streamed one is compared with, checked to be a usable reference: the right
    length, not silent, and almost never at the output's ``limit`` (clamp or tanh), where saturation would
    hide differences."""
    with torch.inference_mode():
        wav = model(codes)
    assert wav.shape == (codes.shape[0], codes.shape[-1] * spf)
    assert wav.std() > 0.05 and (wav.abs() >= limit).float().mean() < 0.01
    return wav


def noise_pcm(seed: int, frames: int, batch: int = 1) -> torch.Tensor:
    """``[batch, frames * SPF]`` band-limited noise with a slow envelope, amplitude well below 1."""
    gen = torch.Generator().manual_seed(seed)
    noise = torch.randn(batch, 1, frames * SPF + 31, generator=gen)
    smooth = torch.nn.functional.avg_pool1d(noise, 32, stride=1)[:, 0]
    env = 0.5 + 0.4 * torch.sin(torch.arange(frames * SPF) / 3000.0)
    return 0.6 * smooth * env
