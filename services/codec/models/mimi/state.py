"""Where a Mimi stream's histories live, and how one streaming step reads and rewrites them in place.

One direction's state for B streams is a single ``[B, width]`` tensor: each stateful block owns a fixed
column range (:class:`StateLayout`), viewed as ``[B, *shape]``. A step reads a block's history through that
view and, once the block has consumed it, writes the new history back into the same view. So the caller
decides where the rows live: a slot pool's first B rows (the packed case, nothing is copied in or out) or a
gathered copy of arbitrary slots that is scattered back afterwards; the math is the same.
"""

from __future__ import annotations

import torch

# The flat layout is the one every codec family's slot pool uses; Mimi's in-place step reads it too.
from services.codec.slot_pool import StateLayout

__all__ = ["StateLayout", "StreamContext"]


class StreamContext:
    """One streaming call for a batch of B streams.

    ``state`` ([B, layout.width]) holds the histories and is advanced in place. ``start`` ([B], int64) is
    each row's absolute frame index; ``frames`` the padded frame count T (a Python int), from which every
    block derives its own time scale using static shapes only. ``lengths`` ([B], int64) is the number of
    real frames per row, or ``None`` when every row is T frames long: then each new history is a static
    slice, not a per-row gather.
    """

    def __init__(
        self,
        state: torch.Tensor,
        layout: StateLayout,
        start: torch.Tensor,
        lengths: torch.Tensor | None,
        frames: int,
    ) -> None:
        if state.dim() != 2 or state.shape[1] != layout.width:
            raise ValueError(f"state must be [batch, {layout.width}], got {tuple(state.shape)}")
        self.state = state
        self.layout = layout
        self.start = start
        self.lengths = lengths
        self.frames = frames
        # Blocks at the same time scale with the same history size share one gather index.
        self._index: dict[tuple[int, int], torch.Tensor] = {}

    def history(self, key: str) -> torch.Tensor:
        return self.layout.view(self.state, key)

    def history_pair(self, first: str, second: str) -> torch.Tensor:
        return self.layout.pair(self.state, first, second)

    def keep_tail(self, dest: torch.Tensor, joined: torch.Tensor, dim: int) -> None:
        """Overwrite the history view ``dest`` with the ``dest.shape[dim]`` steps of ``joined`` (its old
        content ++ new input along ``dim``) that end at each row's last real step. Call it only after
        ``dest`` has been read. With ``lengths`` this is a gather, not a per-row slice: no host sync, so the
        step stays graph-capturable."""
        dim = dim % joined.dim()
        size = dest.shape[dim]
        if self.lengths is None:
            dest.copy_(joined.narrow(dim, joined.shape[dim] - size, size))
            return
        scale = (joined.shape[dim] - size) // self.frames
        index = self._index.get((scale, size))
        if index is None:
            index = self.lengths[:, None] * scale + torch.arange(size, device=joined.device)
            self._index[(scale, size)] = index
        view = [1] * joined.dim()
        view[0], view[dim] = joined.shape[0], size
        torch.gather(joined, dim, index.view(view).expand(dest.shape), out=dest)
