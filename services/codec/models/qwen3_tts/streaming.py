"""Exact stateful streaming decode of the 12 Hz codec over a pool of stream slots.

Why stateful: the decoder's receptive field is ~580 frames (8 window-72 attention layers stacked on causal
convs), so overlap+crop re-decoding is only approximate unless it re-decodes ~46 s per chunk. Keeping each
stream's history instead makes every chunk cost only its new frames, and the concatenated output equals the
single-pass decode up to float rounding.

Per stream the pool holds: the last (k-1)*d inputs of every causal conv, the last ceil(k/s)-1 inputs of every
transposed conv, the last ``sliding_window - 1`` post-RoPE keys/values of every attention layer, and the
absolute frame position (RoPE angles use absolute positions, so a streamed frame sees the same angles as
offline). The pool is allocated once with a leading ``[max_streams]`` slot dimension; ``decode`` gathers
the batch's slots, runs one step and scatters the new state back with ``index_copy_``.
Shapes depend only on (B, T), nothing branches on tensor values and nothing syncs with the host, so one
(B, T) bucket can be captured as a CUDA graph by the engine.
"""

from __future__ import annotations

import math

import torch

from .decoder import Qwen3TokenizerDecoder


def state_bytes_per_stream(model: Qwen3TokenizerDecoder, dtype: torch.dtype | None = None) -> int:
    """Bytes of streaming state one stream needs (history tensors in ``dtype`` plus an int64 position),
    so an engine can size its pool from a memory budget before allocating it."""
    dtype = dtype or model.compute_dtype
    elem = torch.empty((), dtype=dtype).element_size()
    return sum(math.prod(shape) for shape in model.stream_state_shapes().values()) * elem + 8


class StreamingDecoder:
    """Slot pool of decoder states; ``decode`` runs B streams' next chunk together.

    Contract for callers (the codec engine):
    - ``slots`` within one call must be distinct; a padded batch row needs its own scratch slot.
    - a stream's first chunk must follow ``reset`` of its slot (the pool starts zeroed, i.e. reset).
    - ``slots`` / ``lengths`` may live on the device; validation of their values then is the caller's job
      (they are only checked when on the CPU, to keep the step free of host syncs).
    """

    def __init__(self, model: Qwen3TokenizerDecoder, max_streams: int) -> None:
        if max_streams < 1:
            raise ValueError(f"max_streams must be >= 1, got {max_streams}")
        self.model = model
        self.max_streams = max_streams
        param = model.pre_conv.conv.weight
        self.device = param.device
        self.dtype = model.compute_dtype
        self.samples_per_frame = model.samples_per_frame
        self.shapes = model.stream_state_shapes()
        # One flat [max_streams, total] buffer: a decode moves every history of its slots with a single
        # index_select and a single index_copy_ instead of two ops per history tensor.
        self._offsets: dict[str, tuple[int, int]] = {}
        total = 0
        for key, shape in self.shapes.items():
            self._offsets[key] = (total, total + math.prod(shape))
            total += math.prod(shape)
        self.pool = torch.zeros((max_streams, total), device=self.device, dtype=self.dtype)
        self.positions = torch.zeros(max_streams, device=self.device, dtype=torch.int64)
        # Per-key views of the pool, [max_streams, *shape] (for inspection and tests).
        self.state: dict[str, torch.Tensor] = self._split(self.pool)

    def _split(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        rows = flat.shape[0]
        return {k: flat[:, a:b].view(rows, *self.shapes[k]) for k, (a, b) in self._offsets.items()}

    def state_bytes_per_stream(self) -> int:
        return state_bytes_per_stream(self.model, self.dtype)

    def _check(self, codes: torch.Tensor, slots: torch.Tensor, lengths: torch.Tensor | None) -> None:
        self.model.check_codes(codes)
        b, _, t = codes.shape
        if t < 1:
            raise ValueError("codes must hold at least one frame")
        if slots.shape != (b,) or slots.dtype != torch.int64:
            raise ValueError(
                f"slots must be an int64 tensor of shape [{b}], got {slots.dtype} {tuple(slots.shape)}"
            )
        if slots.device.type == "cpu":
            if b and (int(slots.min()) < 0 or int(slots.max()) >= self.max_streams):
                raise ValueError(f"slots must lie in [0, {self.max_streams}), got {slots.tolist()}")
            if len(set(slots.tolist())) != b:
                raise ValueError(f"slots must be distinct within one decode call, got {slots.tolist()}")
        if lengths is not None:
            if lengths.shape != (b,) or lengths.dtype != torch.int64:
                got = f"{lengths.dtype} {tuple(lengths.shape)}"
                raise ValueError(f"lengths must be an int64 tensor of shape [{b}], got {got}")
            if lengths.device.type == "cpu" and b and (int(lengths.min()) < 0 or int(lengths.max()) > t):
                raise ValueError(f"lengths must lie in [0, {t}], got {lengths.tolist()}")

    @torch.inference_mode()
    def decode(
        self, codes: torch.Tensor, slots: torch.Tensor, lengths: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Decode the next T frames of B streams: ``codes`` [B, Q, T], ``slots`` [B] int64 -> wav [B, T*spf].

        ``lengths`` [B] (optional, default T) says how many leading frames of each row are real; the rest
        is right padding so several streams with different chunk sizes share one (B, T) bucket. Only the
        first ``lengths[b] * spf`` samples of row b are meaningful, and only real frames advance its state.
        """
        self._check(codes, slots, lengths)
        codes = codes.to(self.device)
        slots = slots.to(self.device)
        if lengths is None:
            lengths = torch.full_like(slots, codes.shape[-1])
        lengths = lengths.to(self.device)
        start = self.positions.index_select(0, slots)
        batch_state = self._split(self.pool.index_select(0, slots))
        wav, new_state = self.model.forward_streaming(codes, batch_state, start, lengths)
        b = slots.shape[0]
        flat = torch.cat([new_state[key].reshape(b, -1) for key in self._offsets], dim=1)
        self.pool.index_copy_(0, slots, flat)
        self.positions.index_copy_(0, slots, start + lengths)
        return wav

    @torch.inference_mode()
    def reset(self, slots: torch.Tensor) -> None:
        """Clear the given slots (history zeros, position 0) so they start a fresh stream."""
        slots = slots.to(device=self.device, dtype=torch.int64).reshape(-1)
        self.pool.index_fill_(0, slots, 0)
        self.positions.index_fill_(0, slots, 0)

    def position(self, slot: int) -> int:
        """Frames decoded so far on ``slot`` (a host read: for bookkeeping and tests, not the hot path)."""
        return int(self.positions[slot])
