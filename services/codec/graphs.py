"""CUDA-graphed batched decode for the codec engine: one graph per (batch bucket, frame bucket).

Inputs are copied into static buffers sized for the largest bucket; the graph for (B, T) reads their
``[:B, :, :T]`` views. Warm-up/capture run with every row's length set to 0, which leaves every stream's state
untouched (padding frames never advance a stream).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import torch

from services.codec.calls import Bucket, DecodeCalls
from services.codec.engine import StreamingCodec, batch_bucket
from voxstage.cudagraphs import GraphCache


class GraphedDecode(DecodeCalls):
    """A ``decode_fn`` for ``CodecEngine``; ``frame_buckets`` are the chunk sizes that get graphs."""

    def __init__(
        self,
        codec: StreamingCodec,
        *,
        num_groups: int,
        max_batch: int,
        frame_buckets: Sequence[int],
        device: torch.device | str,
        enabled: bool = True,
    ) -> None:
        self.codec = codec
        super().__init__(codec.decode)  # shapes without a graph decode eagerly
        self.frame_buckets = tuple(sorted(set(frame_buckets)))
        self.max_batch = max_batch
        t_max = self.frame_buckets[-1]
        self._codes = torch.zeros(max_batch, num_groups, t_max, dtype=torch.int64, device=device)
        self._slots = torch.zeros(max_batch, dtype=torch.int64, device=device)
        self._lengths = torch.zeros(max_batch, dtype=torch.int64, device=device)
        self._outs: dict[tuple[int, int], torch.Tensor] = {}
        self.graphs = GraphCache(self._decode, enabled=enabled, quiesce=self._no_frames)

    def _decode(self, b: int, t: int) -> None:
        self._outs[(b, t)] = self.codec.decode(self._codes[:b, :, :t], self._slots[:b], self._lengths[:b])

    @contextlib.contextmanager
    def _no_frames(self, key: tuple[int, ...]) -> Iterator[None]:
        saved = self._lengths.clone()
        self._lengths.zero_()
        # Distinct slots are required even for a no-op run; reuse the scratch slots the engine pads with.
        saved_slots = self._slots.clone()
        self._slots.copy_(
            torch.arange(self.max_batch, device=self._slots.device) + self.codec.max_streams // 2
        )
        try:
            yield
        finally:
            self._lengths.copy_(saved)
            self._slots.copy_(saved_slots)

    def batch_buckets(self) -> list[int]:
        """The batch sizes ``CodecEngine`` pads to: powers of two, capped at ``max_batch``."""
        return sorted({batch_bucket(n, self.max_batch) for n in range(1, self.max_batch + 1)})

    def capture_on(self, stream: torch.cuda.Stream) -> None:
        self.graphs.capture_stream = stream

    def capture_all(self, max_frames: int | None = None, keep: Bucket | None = None) -> int:
        """Capture the (batch, frames) graphs with at most ``max_frames`` frames in all, and only those
        ``keep`` allows (the buckets the tick policy can call), before serving (no stream may be decoding):
        a bucket captured on first use stalls every stream due in that tick. Larger buckets (a full engine
        far behind its talkers) stay lazy: their activations would be reserved at start-up for a case that
        is already overload. Returns how many were captured."""
        return sum(self.graphs.capture(b, t) for b, t in self.capture_order(max_frames, keep))

    def captured(self) -> int:
        return len(self.graphs)

    def capture_order(
        self, max_frames: int | None = None, keep: Bucket | None = None
    ) -> list[tuple[int, int]]:
        """The start-up buckets, most frame rows first: the graphs share one memory pool, and a smaller
        capture can reuse blocks a larger one freed."""
        keys = [(b, t) for b in self.batch_buckets() for t in self.frame_buckets]
        keys = [
            (b, t)
            for b, t in keys
            if (max_frames is None or b * t <= max_frames) and (keep is None or keep(b, t))
        ]
        return sorted(keys, key=lambda k: (-k[0] * k[1], -k[1]))

    def __call__(self, codes: torch.Tensor, slots: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        b, _, t = codes.shape
        if b > self.max_batch or t not in self.frame_buckets:
            return self.codec.decode(codes, slots, lengths)  # outside the captured buckets: eager
        self._codes[:b, :, :t].copy_(codes, non_blocking=True)
        self._slots[:b].copy_(slots, non_blocking=True)
        self._lengths[:b].copy_(lengths, non_blocking=True)
        self.graphs.run(b, t)
        return self._outs[(b, t)]
