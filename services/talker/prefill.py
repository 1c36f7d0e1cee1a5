"""Prompt prefill shared by the talker families: one tick's prefill chunks in as few forwards as possible.

Every chunk is right-padded to a power-of-two length (what CUDA graphs need; the eager path pads too, so
both compute the same shapes and, in bf16, the same numbers). Short chunks of the same tick share one
forward of up to ``MAX_ROWS`` rows and ``max_tokens`` padded tokens. Why: the engine runs a tick's prefills
before its frame step, so a burst of arrivals prefilled one call each held every running stream's next
frame back by one prefill per arrival, and a young stream (one 80 ms frame of audio out) then underran.

Padding tokens sit at the positions right after their chunk, so their K/V lands where that slot's next
chunk or first decode step writes before anything reads it (reads are masked to positions at or before
the query). Padding rows repeat row 0 (its slot, positions and input), so they write exactly what row 0
writes and touch no other slot.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from services.talker.launch import bucket
from voxstage.cudagraphs import GraphCache
from voxstage.host_copy import upload

MAX_LENGTH = 512  # padded length of one row; a longer chunk runs eagerly at its exact length
MAX_TOKENS = 1024  # rows x padded length of one forward (8 prompts of up to 128 tokens)
MIN_LENGTH = 16
MAX_ROWS = 8


class KVPoolLike(Protocol):
    """A family's static KV pool: ``k`` is ``[layers, slots, kv_heads, positions, head_dim]``."""

    k: torch.Tensor


class PrefillModel(Protocol):
    """A backbone over input embeddings: ``model(x [B, T, H], positions [B, T], pool, slot_ids [B],
    attn_len)`` writes the rows' K/V into their slots and returns their hidden states ``[B, T, H]`` (kept
    only at each row's last position, and only with ``last_out``)."""

    @property
    def hidden_size(self) -> int: ...

    def __call__(
        self,
        x: torch.Tensor,
        positions: torch.Tensor,
        cache: KVPoolLike,
        slot_ids: torch.Tensor | None,
        attn_len: int | None,
    ) -> torch.Tensor: ...


@dataclass(frozen=True)
class PrefillChunk:
    slot: int
    embeds: torch.Tensor  # [n, hidden]: prompt positions [start, start + n) of the slot
    start: int

    @property
    def end(self) -> int:
        return self.start + self.embeds.shape[0]


class Prefill:
    """Static input buffers, the graph cache and the grouping of chunks into forwards."""

    def __init__(
        self,
        model: PrefillModel,
        kv: KVPoolLike,
        *,
        max_len: int,
        min_attn_bucket: int,
        dtype: torch.dtype | None = None,
        last_out: torch.Tensor | None = None,
    ) -> None:
        """``dtype``: the activations' (the model's); the pool's when None, which an fp8 pool is not.
        ``last_out [slots, hidden]``: where each chunk's output at its last position goes, by slot (what a
        slot's first frame step takes when the prefill ran its prompt's last position)."""
        self.model, self.kv, self.last_out = model, kv, last_out
        self.max_len, self.min_attn_bucket = max_len, min_attn_bucket
        self.max_tokens = MAX_TOKENS  # rows x padded length of one graphed forward
        self.max_length = min(max_len, MAX_LENGTH)  # padded length of one row
        dev, dtype = kv.k.device, dtype or kv.k.dtype
        self._x = torch.zeros(MAX_ROWS, self.max_length, model.hidden_size, device=dev, dtype=dtype)
        self._pos = torch.zeros(MAX_ROWS, self.max_length, device=dev, dtype=torch.int64)
        self._steps = torch.arange(self.max_length, device=dev, dtype=torch.int64)
        self._slots = torch.zeros(MAX_ROWS, device=dev, dtype=torch.int64)
        self._lasts = torch.zeros(MAX_ROWS, device=dev, dtype=torch.int64)  # each row's last real position
        self._rows = torch.arange(MAX_ROWS, device=dev)
        self.padded = True  # a test turns padding off to check that it changes nothing in fp32
        self.graphs: GraphCache | None = None
        self.forwards = 0  # forwards run, for tests and benchmarks

    def enable_cuda_graphs(self) -> None:
        self.graphs = GraphCache(self.core, enabled=True)

    def length_bucket(self, n: int) -> int:
        return bucket(n, self.max_length, MIN_LENGTH)

    def context_bucket(self, n: int) -> int:
        return bucket(n, self.max_len, self.min_attn_bucket)

    def graph_keys(self) -> list[tuple[int, int, int]]:
        """Every (rows, length, context) key ``run`` can reach."""
        lengths = sorted({self.length_bucket(n) for n in range(1, self.max_length + 1)})
        contexts = sorted({self.context_bucket(n) for n in range(1, self.max_len + 1)})
        rows = sorted({bucket(k, MAX_ROWS) for k in range(1, MAX_ROWS + 1)})  # as ``_run_padded`` pads
        return [
            (p, t, c) for p in rows for t in lengths if p * t <= self.max_tokens for c in contexts if c >= t
        ]

    def run(self, chunks: Sequence[PrefillChunk]) -> None:
        for group in self._groups(chunks):
            t = self.length_bucket(max(c.embeds.shape[0] for c in group))
            if self.padded and all(c.embeds.shape[0] <= t and c.start + t <= self.max_len for c in group):
                self._run_padded(group, t)
            else:
                for c in group:
                    self._run_exact(c)

    def _groups(self, chunks: Sequence[PrefillChunk]) -> list[list[PrefillChunk]]:
        """Shortest first, greedily: a group grows while its rows (a power of two) times its padded length
        stay within ``max_tokens``; a chunk longer than that is a group of its own."""
        groups: list[list[PrefillChunk]] = []
        for c in sorted(chunks, key=lambda c: c.embeds.shape[0]):
            if groups and self.padded and c.embeds.shape[0] <= self.max_length:
                cand = [*groups[-1], c]
                rows = bucket(len(cand), MAX_ROWS)
                if len(cand) <= MAX_ROWS and rows * self.length_bucket(c.embeds.shape[0]) <= self.max_tokens:
                    groups[-1] = cand
                    continue
            groups.append([c])
        return groups

    def _run_padded(self, group: list[PrefillChunk], t: int) -> None:
        rows = bucket(len(group), MAX_ROWS)
        for i in range(rows):
            c = group[i] if i < len(group) else group[0]
            n = c.embeds.shape[0]
            self._x[i, :n].copy_(c.embeds)
            self._x[i, n:t].zero_()
            torch.add(self._steps[:t], c.start, out=self._pos[i, :t])
        slots = [c.slot for c in group] + [group[0].slot] * (rows - len(group))
        lasts = [c.embeds.shape[0] - 1 for c in group] + [group[0].embeds.shape[0] - 1] * (rows - len(group))
        both = upload(slots + lasts, self._slots.device)  # one copy up for the two tables
        self._slots[:rows].copy_(both[:rows], non_blocking=True)
        self._lasts[:rows].copy_(both[rows:], non_blocking=True)
        context = self.context_bucket(max(c.start for c in group) + t)
        if self.graphs is not None:
            self.graphs.run(rows, t, context)
        else:
            self.core(rows, t, context)
        self.forwards += 1

    def _run_exact(self, c: PrefillChunk) -> None:
        positions = torch.arange(c.start, c.end, device=self._pos.device).unsqueeze(0)
        slot_ids = upload([c.slot], self._pos.device)
        h = self.model(c.embeds.unsqueeze(0), positions, self.kv, slot_ids, c.end)
        if self.last_out is not None:
            self.last_out[c.slot] = h[0, -1]
        self.forwards += 1

    def core(self, rows: int, t: int, attn_len: int) -> None:
        """The captured forward: ``rows`` chunks of ``t`` tokens (zero-padded) into slots ``_slots``."""
        h = self.model(self._x[:rows, :t], self._pos[:rows, :t], self.kv, self._slots[:rows], attn_len)
        if self.last_out is not None:  # padding rows repeat row 0: the same slot gets the same values
            # Clamped: a graph's warm-up and capture run on whatever the tables hold from an earlier call.
            last = self._lasts[:rows].clamp(max=t - 1)
            self.last_out.index_copy_(0, self._slots[:rows], h[self._rows[:rows], last])
