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
        """Make every gathered write: one indexed write per tensor, after one upload of all the places and
        one of all the values of each dtype (an upload is a pinned copy and a launch, ~20 us of host time
        each on an H200: two per tensor made a lone admission slower than writing each value at once)."""
        rows, cells = self._rows, self._cells
        self._rows, self._cells = {}, {}
        if not rows and not cells:
            return
        places: list[int] = []
        values: dict[torch.dtype, list[Scalar]] = {}
        plan = []  # (tensor, place offsets, value offset, count, is a row write)
        for tensor, by_slot in rows.values():
            vals = values.setdefault(tensor.dtype, [])
            plan.append((tensor, (len(places),), len(vals), len(by_slot), True))
            places += by_slot
            vals += by_slot.values()
        for tensor, by_cell in cells.values():
            vals = values.setdefault(tensor.dtype, [])
            slots, cols = zip(*by_cell, strict=True)
            plan.append((tensor, (len(places), len(places) + len(slots)), len(vals), len(slots), False))
            places += slots + cols
            vals += by_cell.values()
        device = plan[0][0].device
        places_d = upload(places, device)
        values_d = {dt: to_device(torch.tensor(v, dtype=dt), device) for dt, v in values.items()}
        for tensor, at, v0, n, is_row in plan:
            vals_d = values_d[tensor.dtype][v0 : v0 + n]
            if is_row:
                # A row tensor takes each slot's scalar across the row, as fill_ on tensor[slot] does.
                vals_d = vals_d.view(-1, *([1] * (tensor.dim() - 1))).expand(-1, *tensor.shape[1:])
            tensor.index_put_(tuple(places_d[a : a + n] for a in at), vals_d)


IMMEDIATE = ImmediateWrites()
