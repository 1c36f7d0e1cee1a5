"""Flat per-stream streaming state, and the slot pool that decodes B streams' next chunk together.

A codec that streams exactly keeps, per stream, the histories its causal blocks need (conv inputs, post-RoPE
keys/values) plus the stream's absolute frame position. :class:`StateLayout` packs one stream's histories
into one flat row (a fixed column range per history, viewed as ``[B, *shape]``), so a pool of
``max_streams`` rows is a single ``[max_streams, width]`` tensor: a step moves every history of its slots
with one ``index_select`` and one ``index_copy_`` instead of two ops per history tensor.

:class:`SlotPoolDecoder` is the decode-only pool of the text-to-speech codecs (Qwen3-TTS 12 Hz, Audio8): it
drives any model with ``stream_state_shapes()`` and a functional ``forward_streaming(codes, state, start,
lengths) -> (wav, new_state)``. The duplex codec's pool (Mimi, in its family folder) shares the layout and
checks but advances its state in place, in two directions and optionally packed, so it keeps its own pool.
Since a slot's row and position are all a stream carries, ``snapshot`` / ``restore`` copy a stream's state
out and back exactly (the codec's voice states, ``services.codec.voice_states``).
Shapes depend only on (B, T), nothing branches on tensor values and nothing syncs with the host when the
inputs live on the device, so each (B, T) bucket can be captured as a CUDA graph.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

import torch
from torch import nn

from services.codec.checks import check_lengths, check_slots


class StateLayout:
    """Column ranges of each history key in one stream's flat state row (keys in model order)."""

    def __init__(self, shapes: dict[str, tuple[int, ...]]) -> None:
        self.shapes = dict(shapes)
        self.offsets: dict[str, tuple[int, int]] = {}
        width = 0
        for key, shape in self.shapes.items():
            size = math.prod(shape)
            self.offsets[key] = (width, width + size)
            width += size
        self.width = width

    def view(self, flat: torch.Tensor, key: str) -> torch.Tensor:
        try:
            a, b = self.offsets[key]
        except KeyError as exc:
            raise KeyError(f"streaming state has no entry {key!r}") from exc
        return flat[:, a:b].view(flat.shape[0], *self.shapes[key])

    def pair(self, flat: torch.Tensor, first: str, second: str) -> torch.Tensor:
        """``[B, 2, *shape]`` view of two same-shaped keys stored back to back (an attention layer's K and V),
        so both are carried by one concatenation and one write."""
        (a, mid), (mid2, b) = self.offsets[first], self.offsets[second]
        shape = self.shapes[first]
        if mid != mid2 or self.shapes[second] != shape:
            raise ValueError(f"state keys {first!r} and {second!r} are not adjacent and equally shaped")
        return flat[:, a:b].view(flat.shape[0], 2, *shape)

    def views(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        return {key: self.view(flat, key) for key in self.shapes}


def name_state_keys(model: nn.Module, stateful: tuple[type[nn.Module], ...]) -> None:
    """File every ``stateful`` block's history under its module path: unique, stable, and readable (the
    layout's keys are the checkpoint's own names)."""
    for name, module in model.named_modules():
        if isinstance(module, stateful):
            module.state_key = name


def collect_state_shapes(
    parts: Iterable[nn.Module | None], stateful: tuple[type[nn.Module], ...]
) -> dict[str, tuple[int, ...]]:
    """Per-stream shape of every history of the ``stateful`` blocks in ``parts`` (absent parts skipped),
    keyed by state key in module order, which is the order the layout packs them in."""
    shapes: dict[str, tuple[int, ...]] = {}
    for part in parts:
        for module in part.modules() if part is not None else ():
            if isinstance(module, stateful):
                block: Any = module  # each stateful block class defines state_shapes()
                shapes.update(block.state_shapes())
    return shapes


def state_bytes(shapes: Iterable[tuple[int, ...]], dtype: torch.dtype, positions: int = 1) -> int:
    """Bytes of one slot: every history of ``shapes`` in ``dtype`` plus ``positions`` int64 frame counters."""
    elem = torch.empty((), dtype=dtype).element_size()
    return sum(math.prod(shape) for shape in shapes) * elem + 8 * positions


@dataclass(frozen=True)
class DecoderState:
    """One slot's streaming state, copied out of a pool (``SlotPoolDecoder.snapshot``)."""

    row: torch.Tensor  # [width], the pool's dtype and device
    position: torch.Tensor  # 0-d int64: frames the slot had decoded

    @property
    def nbytes(self) -> int:
        return self.row.numel() * self.row.element_size() + 8


class StreamingModel(Protocol):
    """What :class:`SlotPoolDecoder` needs of a codec model (both TTS families' decoders have it)."""

    @property
    def samples_per_frame(self) -> int: ...

    @property
    def compute_dtype(self) -> torch.dtype: ...

    @property
    def device(self) -> torch.device: ...

    def stream_state_shapes(self) -> dict[str, tuple[int, ...]]: ...

    def check_codes(self, codes: torch.Tensor) -> None: ...

    def forward_streaming(
        self,
        codes: torch.Tensor,
        state: dict[str, torch.Tensor],
        start: torch.Tensor,
        lengths: torch.Tensor | None,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]: ...


ModelT = TypeVar("ModelT", bound=StreamingModel)


def state_bytes_per_stream(model: StreamingModel, dtype: torch.dtype | None = None) -> int:
    """Bytes one stream's state takes (histories in ``dtype``, default the model's, plus an int64 position),
    so an engine can size its pool from a memory budget before allocating it."""
    return state_bytes(model.stream_state_shapes().values(), dtype or model.compute_dtype)


class SlotPoolDecoder(Generic[ModelT]):
    """Slot pool of decode states; ``decode`` runs B streams' next chunk together.

    Contract for callers (the codec engine):
    - ``slots`` within one call must be distinct; a padded batch row needs its own scratch slot.
    - a stream's first chunk must follow ``reset`` of its slot (the pool starts zeroed, i.e. reset).
    - ``slots`` / ``lengths`` may live on the device; validation of their values then is the caller's job
      (they are only checked when on the CPU, to keep the step free of host syncs).
    """

    def __init__(self, model: ModelT, max_streams: int) -> None:
        if max_streams < 1:
            raise ValueError(f"max_streams must be >= 1, got {max_streams}")
        self.model = model
        self.max_streams = max_streams
        self.device = model.device
        self.dtype = model.compute_dtype
        self.samples_per_frame = model.samples_per_frame
        self.layout = StateLayout(model.stream_state_shapes())
        self.shapes = self.layout.shapes
        self.pool = torch.zeros((max_streams, self.layout.width), device=self.device, dtype=self.dtype)
        self.positions = torch.zeros(max_streams, device=self.device, dtype=torch.int64)
        # Per-key views of the pool, [max_streams, *shape] (for inspection and tests).
        self.state: dict[str, torch.Tensor] = self.layout.views(self.pool)

    def state_bytes_per_stream(self) -> int:
        return state_bytes_per_stream(self.model, self.dtype)

    @torch.inference_mode()
    def decode(
        self, codes: torch.Tensor, slots: torch.Tensor, lengths: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Decode the next T frames of B streams: ``codes`` [B, Q, T], ``slots`` [B] int64 -> wav [B, T*spf].

        ``lengths`` [B] (optional, default T) says how many leading frames of each row are real; the rest
        is right padding so several streams with different chunk sizes share one (B, T) bucket. Only the
        first ``lengths[b] * spf`` samples of row b are meaningful, and only real frames advance its state
        (``lengths[b] == 0`` leaves the slot exactly as it was). ``None`` reaches the model as is: it then
        takes each new history as a static slice instead of a per-row gather.
        """
        self.model.check_codes(codes)
        batch, frames = codes.shape[0], codes.shape[-1]
        if frames < 1:
            raise ValueError("codes must hold at least one frame")
        check_slots(slots, batch, self.max_streams)
        check_lengths(lengths, batch, frames)
        codes = codes.to(self.device)
        slots = slots.to(self.device)
        if lengths is not None:
            lengths = lengths.to(self.device)
        start = self.positions.index_select(0, slots)
        batch_state = self.layout.views(self.pool.index_select(0, slots))
        wav, new_state = self.model.forward_streaming(codes, batch_state, start, lengths)
        flat = torch.cat([new_state[key].reshape(batch, -1) for key in self.layout.shapes], dim=1)
        self.pool.index_copy_(0, slots, flat.to(self.dtype))
        self.positions.index_copy_(0, slots, start + (frames if lengths is None else lengths))
        return wav

    @torch.inference_mode()
    def reset(self, slots: torch.Tensor) -> None:
        """Clear the given slots (histories zero, position 0) so each starts a fresh stream."""
        slots = slots.to(device=self.device, dtype=torch.int64).reshape(-1)
        self.pool.index_fill_(0, slots, 0)
        self.positions.index_fill_(0, slots, 0)

    @torch.inference_mode()
    def snapshot(self, slot: int) -> DecoderState:
        """A copy of ``slot``'s whole streaming state (every history and its frame position), taken in
        device order after the decodes already launched on it; no host sync."""
        return DecoderState(self.pool[slot].clone(), self.positions[slot].clone())

    @torch.inference_mode()
    def restore(self, slot: int, state: DecoderState) -> None:
        """Put ``state`` (from :meth:`snapshot` of this pool) into ``slot``, in place of ``reset``: the
        next decode continues exactly as the snapshotted stream's would have. ``state`` is left as it was."""
        if state.row.shape != (self.layout.width,) or state.row.dtype != self.dtype:
            raise ValueError(
                f"decoder state of shape {tuple(state.row.shape)} {state.row.dtype} does not fit this pool's "
                f"({self.layout.width},) {self.dtype} slots"
            )
        index = torch.full((1,), slot, dtype=torch.int64, device=self.device)  # no host copy to wait on
        self.pool.index_copy_(0, index, state.row[None])
        self.positions.index_copy_(0, index, state.position[None])

    def position(self, slot: int) -> int:
        """Frames decoded so far on ``slot`` (a host read: bookkeeping and tests, not the hot path)."""
        return int(self.positions[slot])
