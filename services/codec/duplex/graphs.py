"""CUDA-graphed batched calls of the duplex codec engine: one encode and one decode graph per batch bucket.

A tick encodes one frame per session and a burst decodes one agent frame per session (T = 1), over the packed
rows ``[0, B)``; ``B`` is a power of two capped at ``max_batch``. Inputs are copied into static buffers sized
for the largest bucket and the graph for ``B`` reads their ``[:B]`` views. Warm-up and capture run with every
row's length at 0, which leaves every session's state untouched. Other shapes (a talker running ahead, so a
session decodes several frames in one burst) run eagerly.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from services.codec.duplex.calls import PackedCalls
from services.codec.engine import batch_bucket
from voxstage.cudagraphs import GraphCache


class GraphedDuplexCalls(PackedCalls):
    """A drop-in for ``PackedCalls`` (the engine's ``calls``) that replays captured graphs."""

    def __init__(
        self, codec: Any, *, max_batch: int, device: torch.device | str, enabled: bool = True
    ) -> None:
        super().__init__(codec)
        self.eager = PackedCalls(codec)
        self.max_batch = max_batch
        self.spf: int = codec.samples_per_frame
        self._pcm = torch.zeros(max_batch, self.spf, dtype=torch.float32, device=device)
        self._codes = torch.zeros(max_batch, codec.num_codebooks, 1, dtype=torch.int64, device=device)
        self._enc_lengths = torch.zeros(max_batch, dtype=torch.int64, device=device)
        self._dec_lengths = torch.zeros(max_batch, dtype=torch.int64, device=device)
        self._enc_out: dict[int, torch.Tensor] = {}
        self._dec_out: dict[int, torch.Tensor] = {}
        self.encode_graphs = GraphCache(self._encode, enabled=enabled, quiesce=self._quiet(self._enc_lengths))
        self.decode_graphs = GraphCache(self._decode, enabled=enabled, quiesce=self._quiet(self._dec_lengths))

    def _encode(self, b: int) -> None:
        self._enc_out[b] = self.eager.encode(self._pcm[:b], self._enc_lengths[:b])

    def _decode(self, b: int) -> None:
        self._dec_out[b] = self.eager.decode(self._codes[:b], self._dec_lengths[:b])

    @staticmethod
    def _quiet(lengths: torch.Tensor) -> Any:
        @contextlib.contextmanager
        def quiesce(key: tuple[int, ...]) -> Iterator[None]:
            saved = lengths.clone()
            lengths.zero_()
            try:
                yield
            finally:
                lengths.copy_(saved)

        return quiesce

    def batch_buckets(self) -> list[int]:
        return sorted({batch_bucket(n, self.max_batch) for n in range(1, self.max_batch + 1)})

    def capture_all(self) -> int:
        """Capture every bucket before serving (no session may be live); returns how many were captured."""
        return sum(
            self.encode_graphs.capture(b) + self.decode_graphs.capture(b) for b in self.batch_buckets()
        )

    def encode(self, pcm: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        b = pcm.shape[0]
        if b > self.max_batch or pcm.shape[1] != self.spf:
            return self.eager.encode(pcm, lengths)
        self._pcm[:b].copy_(pcm, non_blocking=True)
        self._enc_lengths[:b].copy_(lengths, non_blocking=True)
        self.encode_graphs.run(b)
        return self._enc_out[b]

    def decode(self, codes: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        b = codes.shape[0]
        if b > self.max_batch or codes.shape[2] != 1:
            return self.eager.decode(codes, lengths)
        self._codes[:b].copy_(codes, non_blocking=True)
        self._dec_lengths[:b].copy_(lengths, non_blocking=True)
        self.decode_graphs.run(b)
        return self._dec_out[b]
