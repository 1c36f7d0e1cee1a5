"""Launch/collect plumbing shared by the talker families whose frame step is one graphed ``decode_core``.

A family adapter keeps its slots packed and runs ``decode_core(b, attn_len)`` over slots ``[0, b)``, with
``b`` and ``attn_len`` rounded up to power-of-two buckets (one CUDA graph per pair). ``launch`` returns
before the device finishes (async scheduling may have two steps in flight), so the per-step host buffers
come from a small ring of pinned tensors: the active mask goes up and the step's codes / EOS flags come
down with non-blocking copies, and ``collect`` waits on an event recorded after them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch

RING_DEPTH = 3  # two steps may be outstanding; a pinned buffer is reused only after its step was collected


def bucket(n: int, cap: int, floor: int = 1) -> int:
    """Smallest power of two >= max(n, floor), capped at ``cap``."""
    return min(cap, 1 << (max(n, floor) - 1).bit_length())


def decode_graph_keys(num_slots: int, max_len: int, min_attn_bucket: int) -> list[tuple[int, int]]:
    """Every (batch, context) bucket an engine over ``num_slots`` slots and ``max_len`` positions reaches."""
    batches = sorted({bucket(n, num_slots) for n in range(1, num_slots + 1)})
    contexts = sorted({bucket(n, max_len, min_attn_bucket) for n in range(1, max_len + 1)})
    return [(b, c) for b in batches for c in contexts]


@dataclass
class Pending:
    """A launched step: host views that fill in once ``event`` has completed."""

    codes: torch.Tensor  # host [n, G]
    eos: torch.Tensor  # host [n]
    event: torch.cuda.Event | None


class HostRing:
    """Pinned host buffers for the active mask going up and each step's codes / EOS flags coming down."""

    def __init__(self, num_slots: int, num_groups: int, device: torch.device) -> None:
        pin = device.type == "cuda"
        ring = range(RING_DEPTH)
        self._flags = [torch.zeros(num_slots, dtype=torch.bool, pin_memory=pin) for _ in ring]
        self._codes = [torch.zeros(num_slots, num_groups, dtype=torch.int64, pin_memory=pin) for _ in ring]
        self._eos = [torch.zeros(num_slots, dtype=torch.bool, pin_memory=pin) for _ in ring]
        self._cuda = pin
        self._next = 0

    def upload_active(self, active: Sequence[bool], out: torch.Tensor) -> None:
        """Start a step: advance the ring and copy ``active`` (False-padded to ``len(out)``) into the device
        mask ``out``; from pinned memory, so the copy does not wait for the step still in flight."""
        self._next = (self._next + 1) % RING_DEPTH
        flags = self._flags[self._next]
        flags.zero_()
        flags[: len(active)] = torch.tensor(list(active), dtype=torch.bool)
        out.copy_(flags[: out.shape[0]], non_blocking=True)

    def download(self, codes: torch.Tensor, eos: torch.Tensor, n: int) -> Pending:
        """Queue the copies of rows ``[0, n)`` of the step's device outputs; returns the handle."""
        host_codes, host_eos = self._codes[self._next][:n], self._eos[self._next][:n]
        host_codes.copy_(codes[:n], non_blocking=True)
        host_eos.copy_(eos[:n], non_blocking=True)
        event = None
        if self._cuda:
            event = torch.cuda.Event()
            event.record()
        return Pending(host_codes, host_eos, event)


def collect(handle: object) -> tuple[np.ndarray, np.ndarray]:
    """Wait for a launched step: host arrays ``codes [n, G]`` and ``eos [n]`` (copies; the ring reuses its
    buffers)."""
    assert isinstance(handle, Pending)
    if handle.event is not None:
        handle.event.synchronize()
    return handle.codes.numpy().copy(), handle.eos.numpy().copy()


@contextlib.contextmanager
def all_inactive(active: torch.Tensor) -> Iterator[None]:
    """Every row of the device mask ``active`` off meanwhile, then restored: the quiesce of a graphed
    frame step, whose warm-up runs execute for real and, with every row inactive, change no slot's state."""
    saved = active.clone()
    active.zero_()
    try:
        yield
    finally:
        active.copy_(saved)
