"""Per-slot writes to an adapter's device state, made one at a time or gathered for a whole tick.

Admitting a request resets a few dozen per-slot values (frame counters, seeds, sampling rows, the text
queue). One ``fill_`` launch each costs ~20 us of host time on an H200, so a closed loop's wave of 256
joiners held the talker's engine thread for 220 ms with the GPU idle (docs/benchmarks.md, tenth session).
``SlotWrites`` keeps the same writes and makes them at ``flush`` with one indexed write per tensor,
whatever the number of slots: the same values land in the same places, so the frames do not change.

Both kinds run on the engine thread; device values travel through pinned host memory without waiting for
the device (``prefill.to_device``), so neither waits for a frame step in flight (async scheduling).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from voxstage.host_copy import to_device, upload

Scalar = bool | int | float


class ImmediateWrites:
    """Each write launched as it is made (streamed text, and families that admit one slot at a time)."""

    def put(self, tensor: torch.Tensor, slot: int, value: Scalar) -> None:
        """``tensor[slot] = value`` (a whole row for a tensor of more than one dimension)."""
        # fill_ passes the value as a kernel argument; item assignment would copy a host scalar and wait.
        tensor[slot].fill_(value)

    def span(self, tensor: torch.Tensor, slot: int, start: int, values: Sequence[int]) -> None:
        """``tensor[slot, start : start + len(values)] = values`` (int64)."""
        if values:
            tensor[slot, start : start + len(values)].copy_(upload(values, tensor.device), non_blocking=True)


class SlotWrites(ImmediateWrites):
    """The same writes, gathered until ``flush``: later writes to a place replace earlier ones, as the
    immediate writes made in order would."""

    def __init__(self) -> None:
        self._rows: dict[int, tuple[torch.Tensor, dict[int, Scalar]]] = {}
        self._cells: dict[int, tuple[torch.Tensor, dict[tuple[int, int], int]]] = {}

    def put(self, tensor: torch.Tensor, slot: int, value: Scalar) -> None:
        self._rows.setdefault(id(tensor), (tensor, {}))[1][slot] = value

    def span(self, tensor: torch.Tensor, slot: int, start: int, values: Sequence[int]) -> None:
        if not values:
            return
        cells = self._cells.setdefault(id(tensor), (tensor, {}))[1]
        for i, v in enumerate(values):
            cells[(slot, start + i)] = v

    def __len__(self) -> int:
        return sum(len(v) for _, v in self._rows.values()) + sum(len(v) for _, v in self._cells.values())

    def flush(self) -> None:
        """Make every gathered write: one indexed write per tensor (two uploads: places and values)."""
        rows, cells = self._rows, self._cells
        self._rows, self._cells = {}, {}
        for tensor, by_slot in rows.values():
            index = upload(list(by_slot), tensor.device)
            values = to_device(torch.tensor(list(by_slot.values()), dtype=tensor.dtype), tensor.device)
            # A row tensor takes each slot's scalar across the row, as fill_ on tensor[slot] does.
            values = values.view(-1, *([1] * (tensor.dim() - 1))).expand(-1, *tensor.shape[1:])
            tensor.index_put_((index,), values)
        for tensor, by_cell in cells.values():
            slots, cols = zip(*by_cell, strict=True)
            index = (upload(slots, tensor.device), upload(cols, tensor.device))
            values = to_device(torch.tensor(list(by_cell.values()), dtype=tensor.dtype), tensor.device)
            tensor.index_put_(index, values)


IMMEDIATE = ImmediateWrites()
