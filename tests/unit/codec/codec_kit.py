"""Deterministic inputs shared by the codec tests."""

from __future__ import annotations

import torch

SPF = 1920  # samples per 12.5 Hz frame at 24 kHz (both codecs)


def random_codes(seed: int, frames: int, batch: int = 1, groups: int = 16) -> torch.Tensor:
    """``[batch, groups, frames]`` codes in [0, 2048)."""
    return torch.randint(0, 2048, (batch, groups, frames), generator=torch.Generator().manual_seed(seed))


def noise_pcm(seed: int, frames: int, batch: int = 1) -> torch.Tensor:
    """``[batch, frames * SPF]`` band-limited noise with a slow envelope, amplitude well below 1."""
    gen = torch.Generator().manual_seed(seed)
    noise = torch.randn(batch, 1, frames * SPF + 31, generator=gen)
    smooth = torch.nn.functional.avg_pool1d(noise, 32, stride=1)[:, 0]
    env = 0.5 + 0.4 * torch.sin(torch.arange(frames * SPF) / 3000.0)
    return 0.6 * smooth * env
