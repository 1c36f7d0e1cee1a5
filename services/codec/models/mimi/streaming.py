"""Exact, batched, stateful Mimi streaming in both directions over a pool of stream slots.

Why stateful: the decode side's receptive field is ~1000 frames (8 layers x 249 steps at 25 Hz on top of the
conv stacks), so re-decoding with a left context is never exact at a practical cost. Each slot instead
keeps, per direction, the last ``(k-1)*d + 1 - stride`` inputs of every causal conv, the last
``ceil(k/s) - 1`` inputs of every transposed conv (both resamplers included), the last ``context - 2``
post-RoPE keys/values of every attention layer (2 = steps per frame; see ``transformer.py`` for why that
is the whole reachable window), and its absolute frame index; the stride-2 downsampler's
left padding is the stream's first latent, picked where a row's index is 0. Streamed output equals the
offline pass (``MimiModel.encode``/``decode``) and moshi's frame-by-frame streaming at every chunking.

A duplex session uses both directions of one slot: ``encode`` (user PCM -> codes) and ``decode`` (agent
codes -> PCM) have separate pools and positions, and ``reset`` clears either or both.

Each direction's pool is one flat ``[max_streams, width]`` buffer (``state.py``: a fixed column range per
history). A step reads and rewrites the histories of its B rows in place, so where the rows live is the
only difference between the two ways to call it, which share all of the math:

* packed (``encode_packed`` / ``decode_packed``): the rows are slots ``[0, B)`` in order, as the duplex
  engines keep their sessions. The step runs directly on the pool's first B rows: nothing is gathered or
  scattered. ``move_slot`` compacts the pool when a session leaves.
* slot-indexed (``encode`` / ``decode`` with ``slots``): arbitrary distinct slots, gathered with one
  ``index_select``, advanced, and written back with one ``index_copy_``.

Shapes depend only on (B, T), nothing branches on tensor values and nothing syncs with the host, so each
(B, T) bucket of either kind can be captured as a CUDA graph. Rows may be at different absolute positions;
a row's ``lengths`` entry says how many of the T frames are real (the rest is right padding that never
touches its state); ``lengths=None`` means every row is T frames long, which takes each new history as a
static slice instead of a per-row gather.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal, TypeVar

import torch

from services.codec.checks import check_lengths, check_slots
from services.codec.slot_pool import StateLayout, state_bytes

from .model import MimiModel

Direction = Literal["both", "encode", "decode"]
_Out = TypeVar("_Out")


def state_bytes_per_stream(model: MimiModel, dtype: torch.dtype | None = None) -> int:
    """Bytes one slot needs (both directions' histories in ``dtype`` plus two int64 positions), so an
    engine can size its pool from a memory budget before allocating it."""
    shapes = [*model.encode_state_shapes().values(), *model.decode_state_shapes().values()]
    return state_bytes(shapes, dtype or model.compute_dtype, positions=2)


class _SlotPool:
    """Flat state of one direction for ``max_streams`` slots, plus each slot's frame position."""

    def __init__(
        self, layout: StateLayout, max_streams: int, device: torch.device, dtype: torch.dtype
    ) -> None:
        self.layout = layout
        self.flat = torch.zeros((max_streams, layout.width), device=device, dtype=dtype)
        self.positions = torch.zeros(max_streams, device=device, dtype=torch.int64)

    def advance(
        self,
        slots: torch.Tensor | None,
        batch: int,
        frames: int,
        lengths: torch.Tensor | None,
        step: Callable[[torch.Tensor, torch.Tensor], _Out],
    ) -> _Out:
        """Run ``step(state, start)`` on the rows of ``slots`` (``None``: slots ``[0, batch)``), which
        advances ``state`` in place, then move those rows' positions on by their real frame counts."""
        if slots is None:
            start = self.positions[:batch]
            out = step(self.flat[:batch], start)
            start.add_(frames if lengths is None else lengths)
            return out
        state = self.flat.index_select(0, slots)
        start = self.positions.index_select(0, slots)
        out = step(state, start)
        self.flat.index_copy_(0, slots, state)
        self.positions.index_copy_(0, slots, start.add_(frames if lengths is None else lengths))
        return out

    def reset(self, slots: torch.Tensor) -> None:
        self.flat.index_fill_(0, slots, 0)
        self.positions.index_fill_(0, slots, 0)

    def move(self, src: int, dst: int) -> None:
        self.flat[dst].copy_(self.flat[src])
        self.positions[dst].copy_(self.positions[src])


class MimiStreamingCodec:
    """Slot pool of Mimi encode and decode states; one call advances B streams together.

    Contract for callers (the codec engines):
    - slot-indexed calls: ``slots`` within one call must be distinct; a padded batch row needs a scratch
      slot of its own.
    - packed calls work on slots ``[0, B)``; a row past the live sessions (a bucket's padding) is a scratch
      slot: give it ``lengths`` 0 to leave it untouched, or reset it before a session takes it.
    - a stream's first frame must follow ``reset`` of its slot (the pool starts zeroed, i.e. reset).
    - ``slots`` / ``lengths`` may live on the device; their values are then the caller's responsibility
      (they are only checked on CPU, to keep the step free of host syncs).
    """

    def __init__(self, model: MimiModel, max_streams: int) -> None:
        if max_streams < 1:
            raise ValueError(f"max_streams must be >= 1, got {max_streams}")
        self.model = model
        self.max_streams = max_streams
        self.samples_per_frame = model.samples_per_frame
        self.num_codebooks = model.num_codebooks
        self.codebook_size = model.codebook_size
        self.sample_rate = model.config.sample_rate
        self.device = model.encoder.model[0].conv.conv.weight.device
        self.dtype = model.compute_dtype
        self._enc = _SlotPool(model.encode_layout, max_streams, self.device, self.dtype)
        self._dec = _SlotPool(model.decode_layout, max_streams, self.device, self.dtype)

    # -- sizing / inspection --------------------------------------------------------------------------
    def state_bytes_per_stream(self) -> int:
        """Bytes one slot holds (both directions' histories plus two int64 positions)."""
        return state_bytes_per_stream(self.model, self.dtype)

    def encode_state(self) -> dict[str, torch.Tensor]:
        """Per-key ``[max_streams, *shape]`` views of the encode pool (for tests and inspection)."""
        return self._enc.layout.views(self._enc.flat)

    def decode_state(self) -> dict[str, torch.Tensor]:
        return self._dec.layout.views(self._dec.flat)

    def position(self, slot: int, direction: Literal["encode", "decode"] = "decode") -> int:
        """Frames done on ``slot`` in one direction (a host read: bookkeeping and tests only)."""
        pool = self._enc if direction == "encode" else self._dec
        return int(pool.positions[slot])

    # -- the steps: slot-indexed -------------------------------------------------------------------------
    def decode(
        self, codes: torch.Tensor, slots: torch.Tensor, lengths: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Next T frames of B streams: ``codes`` [B, K, T] int64, ``slots`` [B] int64 -> PCM [B, T*spf].

        ``lengths`` [B] (default T): leading real frames per row; only the first ``lengths[b] * spf``
        samples of row b are meaningful and only real frames advance its state.
        """
        return self._decode(codes, self._check_slots(slots, codes.shape[0]), lengths)

    def encode_with_latent(
        self, pcm: torch.Tensor, slots: torch.Tensor, lengths: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Next T frames of B streams: ``pcm`` [B, T*spf] float -> (codes [B, K, T] int64, unquantized
        latents [B, dim, T]); ``slots`` / ``lengths`` as in :meth:`decode`."""
        return self._encode(pcm, self._check_slots(slots, pcm.shape[0]), lengths)

    def encode(
        self, pcm: torch.Tensor, slots: torch.Tensor, lengths: torch.Tensor | None = None
    ) -> torch.Tensor:
        """``pcm`` [B, T*spf] -> codes [B, K, T] int64 (see :meth:`encode_with_latent`)."""
        return self.encode_with_latent(pcm, slots, lengths)[0]

    # -- the steps: packed (rows are slots [0, B)) -------------------------------------------------------
    def decode_packed(self, codes: torch.Tensor, lengths: torch.Tensor | None = None) -> torch.Tensor:
        """:meth:`decode` of slots ``[0, B)``, row b on slot b, run in place on the pool (no gather or
        scatter of the state). Same results as ``decode(codes, torch.arange(B), lengths)``."""
        return self._decode(codes, None, lengths)

    def encode_packed_with_latent(
        self, pcm: torch.Tensor, lengths: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`encode_with_latent` of slots ``[0, B)``, in place on the pool (as :meth:`decode_packed`)."""
        return self._encode(pcm, None, lengths)

    def encode_packed(self, pcm: torch.Tensor, lengths: torch.Tensor | None = None) -> torch.Tensor:
        """``pcm`` [B, T*spf] -> codes [B, K, T] int64 of slots ``[0, B)``."""
        return self._encode(pcm, None, lengths)[0]

    # -- slot management ---------------------------------------------------------------------------------
    @torch.inference_mode()
    def reset(self, slots: torch.Tensor, direction: Direction = "both") -> None:
        """Clear ``slots`` (histories zero, position 0) in one or both directions: a fresh stream."""
        if direction not in ("both", "encode", "decode"):
            raise ValueError(f"direction must be 'both', 'encode' or 'decode', got {direction!r}")
        slots = slots.to(device=self.device, dtype=torch.int64).reshape(-1)
        if direction in ("both", "encode"):
            self._enc.reset(slots)
        if direction in ("both", "decode"):
            self._dec.reset(slots)

    @torch.inference_mode()
    def move_slot(self, src: int, dst: int) -> None:
        """Copy slot ``src``'s streams (both directions: histories and positions) onto slot ``dst``, which
        then continues them exactly; ``src`` is left as it was. Keeps packed sessions packed: when the
        session on slot i leaves, ``move_slot(B - 1, i)`` fills the hole and slots ``[0, B - 1)`` remain."""
        for name, slot in (("src", src), ("dst", dst)):
            if not 0 <= slot < self.max_streams:
                raise ValueError(f"{name} must lie in [0, {self.max_streams}), got {slot}")
        if src != dst:
            self._enc.move(src, dst)
            self._dec.move(src, dst)

    # -- shared implementation ---------------------------------------------------------------------------
    @torch.inference_mode()
    def _decode(
        self, codes: torch.Tensor, slots: torch.Tensor | None, lengths: torch.Tensor | None
    ) -> torch.Tensor:
        self.model.check_codes(codes)
        batch, frames = codes.shape[0], codes.shape[-1]
        lengths = self._check_lengths(lengths, batch, frames)
        codes = codes.to(self.device)

        def step(state: torch.Tensor, start: torch.Tensor) -> torch.Tensor:
            return self.model.decode_step(codes, state, start, lengths)

        return self._dec.advance(slots, batch, frames, lengths, step)

    @torch.inference_mode()
    def _encode(
        self, pcm: torch.Tensor, slots: torch.Tensor | None, lengths: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        self.model.check_pcm(pcm, whole_frames=True)
        batch, frames = pcm.shape[0], pcm.shape[1] // self.samples_per_frame
        lengths = self._check_lengths(lengths, batch, frames)
        pcm = pcm.to(self.device)

        def step(state: torch.Tensor, start: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return self.model.encode_step(pcm, state, start, lengths)

        return self._enc.advance(slots, batch, frames, lengths, step)

    def _check_slots(self, slots: torch.Tensor, batch: int) -> torch.Tensor:
        check_slots(slots, batch, self.max_streams)
        return slots.to(self.device)

    def _check_lengths(self, lengths: torch.Tensor | None, batch: int, frames: int) -> torch.Tensor | None:
        if batch > self.max_streams:
            raise ValueError(f"a call holds at most max_streams={self.max_streams} rows, got {batch}")
        check_lengths(lengths, batch, frames)
        return None if lengths is None else lengths.to(self.device)
