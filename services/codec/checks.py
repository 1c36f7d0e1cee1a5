"""Input checks that every codec family's decode and slot pool run the same way.

Shapes and dtypes are always checked. Values (code, slot and length ranges) are checked only for tensors on
the CPU: reading a device tensor's values would sync the host in the middle of a step (and break CUDA-graph
capture), so for device inputs they are the caller's responsibility. Codes are range-checked on the host
because an out-of-range index on CUDA is a device-side assert that kills the process.
"""

from __future__ import annotations

import torch


def check_codes(codes: torch.Tensor, num_codebooks: int, codebook_size: int, *, min_frames: int = 0) -> None:
    """``codes`` must be int64/int32 ``[batch, num_codebooks, frames >= min_frames]`` in
    ``[0, codebook_size)``."""
    frames = f"frames >= {min_frames}" if min_frames else "frames"
    if codes.dim() != 3 or codes.shape[1] != num_codebooks or codes.shape[2] < min_frames:
        raise ValueError(f"codes must be [batch, {num_codebooks}, {frames}], got {tuple(codes.shape)}")
    if codes.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"codes must be int64 or int32, got {codes.dtype}")
    if codes.device.type == "cpu" and codes.numel():
        lo, hi = int(codes.min()), int(codes.max())
        if lo < 0 or hi >= codebook_size:
            raise ValueError(f"codes must lie in [0, {codebook_size}), got values in [{lo}, {hi}]")


def check_slots(slots: torch.Tensor, batch: int, max_streams: int) -> None:
    """``slots`` must be int64 ``[batch]``, distinct and in ``[0, max_streams)``: two rows on one slot would
    both read its history and the last write would win."""
    if slots.shape != (batch,) or slots.dtype != torch.int64:
        raise ValueError(
            f"slots must be an int64 tensor of shape [{batch}], got {slots.dtype} {tuple(slots.shape)}"
        )
    if slots.device.type == "cpu" and batch:
        if int(slots.min()) < 0 or int(slots.max()) >= max_streams:
            raise ValueError(f"slots must lie in [0, {max_streams}), got {slots.tolist()}")
        if len(set(slots.tolist())) != batch:
            raise ValueError(f"slots must be distinct within one call, got {slots.tolist()}")


def check_lengths(lengths: torch.Tensor | None, batch: int, frames: int) -> None:
    """``lengths`` (real frames per row; ``None``: all ``frames``) must be int64 ``[batch]`` in
    ``[0, frames]``."""
    if lengths is None:
        return
    if lengths.shape != (batch,) or lengths.dtype != torch.int64:
        got = f"{lengths.dtype} {tuple(lengths.shape)}"
        raise ValueError(f"lengths must be an int64 tensor of shape [{batch}], got {got}")
    if lengths.device.type == "cpu" and batch and (int(lengths.min()) < 0 or int(lengths.max()) > frames):
        raise ValueError(f"lengths must lie in [0, {frames}], got {lengths.tolist()}")
