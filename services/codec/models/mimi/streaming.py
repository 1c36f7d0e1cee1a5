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

Each direction's pool is one flat ``[max_streams, total]`` buffer: a call gathers its rows with one
``index_select``, runs the batch, and scatters the new state back with one ``index_copy_``. Shapes depend
only on (B, T), nothing branches on tensor values and nothing syncs with the host, so each (B, T) bucket can
be captured as a CUDA graph. Rows may be at different absolute positions; a row's ``lengths`` entry says how
many of the T frames are real (the rest is right padding that never touches its state).
"""

from __future__ import annotations

import math
from typing import Literal

import torch

from .model import MimiModel

Direction = Literal["both", "encode", "decode"]


def state_bytes_per_stream(model: MimiModel, dtype: torch.dtype | None = None) -> int:
    """Bytes one slot needs (both directions' histories in ``dtype`` plus two int64 positions), so an
    engine can size its pool from a memory budget before allocating it."""
    elem = torch.empty((), dtype=dtype or model.compute_dtype).element_size()
    shapes = [*model.encode_state_shapes().values(), *model.decode_state_shapes().values()]
    return sum(math.prod(shape) for shape in shapes) * elem + 2 * 8


class _SlotPool:
    """Flat state of one direction for ``max_streams`` slots, plus each slot's frame position."""

    def __init__(
        self, shapes: dict[str, tuple[int, ...]], max_streams: int, device: torch.device, dtype: torch.dtype
    ) -> None:
        self.shapes = shapes
        self.offsets: dict[str, tuple[int, int]] = {}
        total = 0
        for key, shape in shapes.items():
            self.offsets[key] = (total, total + math.prod(shape))
            total += math.prod(shape)
        self.flat = torch.zeros((max_streams, total), device=device, dtype=dtype)
        self.positions = torch.zeros(max_streams, device=device, dtype=torch.int64)

    def split(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        rows = flat.shape[0]
        return {k: flat[:, a:b].view(rows, *self.shapes[k]) for k, (a, b) in self.offsets.items()}

    def gather(self, slots: torch.Tensor) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        return self.split(self.flat.index_select(0, slots)), self.positions.index_select(0, slots)

    def scatter(self, slots: torch.Tensor, state: dict[str, torch.Tensor], positions: torch.Tensor) -> None:
        b = slots.shape[0]
        if self.offsets:
            flat = torch.cat([state[key].reshape(b, -1) for key in self.offsets], dim=1)
            self.flat.index_copy_(0, slots, flat.to(self.flat.dtype))
        self.positions.index_copy_(0, slots, positions)

    def reset(self, slots: torch.Tensor) -> None:
        self.flat.index_fill_(0, slots, 0)
        self.positions.index_fill_(0, slots, 0)


class MimiStreamingCodec:
    """Slot pool of Mimi encode and decode states; one call advances B streams together.

    Contract for callers (the codec engine):
    - ``slots`` within one call must be distinct; a padded batch row needs a scratch slot of its own.
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
        self._enc = _SlotPool(model.encode_state_shapes(), max_streams, self.device, self.dtype)
        self._dec = _SlotPool(model.decode_state_shapes(), max_streams, self.device, self.dtype)

    # -- sizing / inspection --------------------------------------------------------------------------
    def state_bytes_per_stream(self) -> int:
        """Bytes one slot holds (both directions' histories plus two int64 positions)."""
        return state_bytes_per_stream(self.model, self.dtype)

    def encode_state(self) -> dict[str, torch.Tensor]:
        """Per-key ``[max_streams, *shape]`` views of the encode pool (for tests and inspection)."""
        return self._enc.split(self._enc.flat)

    def decode_state(self) -> dict[str, torch.Tensor]:
        return self._dec.split(self._dec.flat)

    def position(self, slot: int, direction: Literal["encode", "decode"] = "decode") -> int:
        """Frames done on ``slot`` in one direction (a host read: bookkeeping and tests only)."""
        pool = self._enc if direction == "encode" else self._dec
        return int(pool.positions[slot])

    # -- the steps -------------------------------------------------------------------------------------
    @torch.inference_mode()
    def decode(
        self, codes: torch.Tensor, slots: torch.Tensor, lengths: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Next T frames of B streams: ``codes`` [B, K, T] int64, ``slots`` [B] int64 -> PCM [B, T*spf].

        ``lengths`` [B] (default T): leading real frames per row; only the first ``lengths[b] * spf``
        samples of row b are meaningful and only real frames advance its state.
        """
        self.model.check_codes(codes)
        slots, lengths = self._check_rows(slots, lengths, codes.shape[0], codes.shape[-1])
        state, start = self._dec.gather(slots)
        pcm, new_state = self.model.decode_step(codes.to(self.device), state, start, lengths)
        self._dec.scatter(slots, new_state, start + lengths)
        return pcm

    @torch.inference_mode()
    def encode_with_latent(
        self, pcm: torch.Tensor, slots: torch.Tensor, lengths: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Next T frames of B streams: ``pcm`` [B, T*spf] float -> (codes [B, K, T] int64, unquantized
        latents [B, dim, T]); ``slots`` / ``lengths`` as in :meth:`decode`."""
        self.model.check_pcm(pcm, whole_frames=True)
        frames = pcm.shape[1] // self.samples_per_frame
        slots, lengths = self._check_rows(slots, lengths, pcm.shape[0], frames)
        state, start = self._enc.gather(slots)
        codes, latent, new_state = self.model.encode_step(pcm.to(self.device), state, start, lengths)
        self._enc.scatter(slots, new_state, start + lengths)
        return codes, latent

    def encode(
        self, pcm: torch.Tensor, slots: torch.Tensor, lengths: torch.Tensor | None = None
    ) -> torch.Tensor:
        """``pcm`` [B, T*spf] -> codes [B, K, T] int64 (see :meth:`encode_with_latent`)."""
        return self.encode_with_latent(pcm, slots, lengths)[0]

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

    def _check_rows(
        self, slots: torch.Tensor, lengths: torch.Tensor | None, batch: int, frames: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if slots.shape != (batch,) or slots.dtype != torch.int64:
            raise ValueError(
                f"slots must be an int64 tensor of shape [{batch}], got {slots.dtype} {tuple(slots.shape)}"
            )
        if slots.device.type == "cpu" and batch:
            if int(slots.min()) < 0 or int(slots.max()) >= self.max_streams:
                raise ValueError(f"slots must lie in [0, {self.max_streams}), got {slots.tolist()}")
            if len(set(slots.tolist())) != batch:
                raise ValueError(f"slots must be distinct within one call, got {slots.tolist()}")
        if lengths is None:
            lengths = torch.full((batch,), frames, dtype=torch.int64, device=slots.device)
        elif lengths.shape != (batch,) or lengths.dtype != torch.int64:
            got = f"{lengths.dtype} {tuple(lengths.shape)}"
            raise ValueError(f"lengths must be an int64 tensor of shape [{batch}], got {got}")
        elif (
            lengths.device.type == "cpu" and batch and (int(lengths.min()) < 0 or int(lengths.max()) > frames)
        ):
            raise ValueError(f"lengths must lie in [0, {frames}], got {lengths.tolist()}")
        return slots.to(self.device), lengths.to(self.device)
