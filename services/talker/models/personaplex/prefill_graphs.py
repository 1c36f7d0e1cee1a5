"""Whole-prompt prefill replayed from CUDA graphs: a join's prompts padded to a length bucket, a few a replay.

An eager 7B prefill is launch-bound (H200: 15 ms for one 59-position prompt, 19 ms for eight, a few hundred
kernel launches either way), and in a join burst those calls sit between the live sessions' steps. A graph
replays the same work for its device time alone. Shapes are static: each prompt's rows are padded with zeros
to ``pad`` positions (the smallest bucket that holds it); the padding's K/V lands at positions ``[n, pad)``
of the slot's ring, where the session's own decode steps write before anything reads them (a step at
position ``p`` writes ``p`` and attends to ``[0, p]``; a reused slot held stale K/V there before, too).
Chunks that do not start at 0, prompts longer than the largest bucket, and more prompts than
``max_batch`` (split into replays) keep to what fits; the rest runs eagerly.

Without CUDA graphs (CPU) the same padded path runs eagerly, so the tests check exactly what is replayed.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from voxstage.cudagraphs import GraphCache

from .model import PersonaPlexLM, RingKV

PADS = (64, 128)  # prompt length buckets (the seed's prompts: 59 positions with a stored voice)
MAX_BATCH = 8  # prompts a replay (the seed's 512-position budget takes eight 59-position prompts)


class PrefillGraphs:
    def __init__(
        self,
        model: PersonaPlexLM,
        kv: RingKV,
        *,
        graphs: bool,
        pads: Sequence[int] = PADS,
        max_batch: int = MAX_BATCH,
    ) -> None:
        self.model, self.kv = model, kv
        self.pads, self.max_batch = tuple(sorted(pads)), max_batch
        dim = model.config.dim
        self.x = torch.zeros(max_batch * self.pads[-1], dim, device=model.device, dtype=model.dtype)
        self.index = torch.zeros(max_batch, dtype=torch.long, device=model.device)
        self.cache = GraphCache(self._core, enabled=graphs)

    def pad_for(self, start: int, n: int) -> int | None:
        """The bucket a chunk ``[start, start + n)`` replays in; None: it runs eagerly."""
        if start != 0:
            return None
        return next((p for p in self.pads if n <= p <= self.kv.window), None)

    def run(self, rows: torch.Tensor, index: torch.Tensor, n: int, pad: int) -> None:
        """Prefill ``rows [b * n, dim]`` (prompt after prompt) into the slots ``index [b]`` at ``[0, n)``."""
        for lo in range(0, index.numel(), self.max_batch):
            part = index[lo : lo + self.max_batch]
            b = part.numel()
            x = self.x[: b * pad].view(b, pad, -1)
            x[:, :n] = rows[lo * n : (lo + b) * n].view(b, n, -1)
            x[:, n:].zero_()
            self.index[:b].copy_(part)
            self.cache.run(b, pad)

    def capture_all(self) -> int:
        """Every (batch, bucket) graph, before serving: the warm-up runs write K/V into the slots the index
        holds, so no session may be live."""
        return sum(self.cache.capture(b, p) for b, p in self.keys())

    def keys(self) -> list[tuple[int, int]]:
        """Every (batch, bucket) a replay may take."""
        return [(b, p) for b in range(1, self.max_batch + 1) for p in self.pads]

    def _core(self, b: int, pad: int) -> None:
        self.model.transformer.prefill(self.x[: b * pad], b, 0, self.kv, self.index[:b])
