"""Host-to-device copies that never wait for the device, for the stages' engine threads.

A copy from pageable host memory makes the host wait for everything queued on the stream before it; with
async scheduling that is the frame step or the decode in flight, so the engine thread sat idle (spinning)
until the device finished, and the next launch it was preparing came late. A copy through pinned memory is
queued and returns at once. A fresh pinned tensor each call: the caching host allocator keeps it until the
copy has run, so a later call cannot overwrite values still waiting in the queue (a reused staging buffer
could).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def to_device(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``host`` on ``device`` without waiting for the device; a tensor already there, or a CPU device, gets
    a plain ``.to``."""
    if device.type != "cuda" or host.device.type == "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)


def upload(values: Sequence[int], device: torch.device) -> torch.Tensor:
    """``values`` as an int64 tensor on ``device`` without waiting for the device."""
    return to_device(torch.tensor(values, dtype=torch.int64), device)
