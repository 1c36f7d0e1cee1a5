"""Every duplex session's user-audio jitter buffer in one array, so a tick gathers all of them at once.

Row ``slot`` of ``buf`` is that slot's buffer, circular: ``fill`` samples from ``head`` on, the first of them
the gateway's sample ``start``. A tick takes one frame from every row that holds one with a single gather
(``take``), instead of slicing each session's buffer in Python. Rows follow the engine's packed slots
(``move`` when the last session fills a hole). Only the engine thread touches it.

A row holds ``capacity`` samples at most, but its storage is whole frames (``length``), and ``head`` only
ever moves by whole frames (or back to 0 when the row empties), so the oldest frame never wraps: ``take``
gathers whole frames by row, a copy of each, where an index per sample cost 28 µs per session at 128
sessions (bench/duplex_engine_python.py).
"""

from __future__ import annotations

import math

import numpy as np


class JitterRing:
    def __init__(self, slots: int, capacity: int, frame: int) -> None:
        if capacity < frame:
            raise ValueError(f"jitter buffer must hold one frame ({frame}), got {capacity}")
        self.capacity = capacity
        self.frame = frame
        self.length = math.ceil(capacity / frame) * frame  # the storage of a row: whole frames
        self.buf = np.zeros((slots, self.length), np.float32)
        self._frames = self.buf.reshape(slots, self.length // frame, frame)  # the same memory, by frame
        self.head = np.zeros(slots, np.int64)  # position of the oldest sample in the row (a whole frame)
        self.fill = np.zeros(slots, np.int64)  # samples held
        self.start = np.zeros(slots, np.int64)  # the gateway's sample index of the oldest (a frame boundary)

    def reset(self, slot: int) -> None:
        self.head[slot] = self.fill[slot] = self.start[slot] = 0

    def end(self, slot: int) -> int:
        """The gateway's sample index the next audio of this slot must start at."""
        return int(self.start[slot] + self.fill[slot])

    def clear(self, slot: int) -> None:
        """Forget what the slot holds (its input ended)."""
        self.fill[slot] = 0

    def push(self, slot: int, pcm: np.ndarray) -> int:
        """Append ``pcm`` (at most ``capacity`` samples); beyond the capacity the oldest whole frames of
        what is held and what arrives are dropped, so the newest audio is kept. Returns how many."""
        n, fill = pcm.size, int(self.fill[slot])
        dropped = 0
        over = fill + n - self.capacity
        if over > 0:
            dropped = math.ceil(over / self.frame) * self.frame
            old = min(dropped, fill)
            # Whole frames off the head, or everything held (then the row starts again at 0).
            self.head[slot] = (self.head[slot] + old) % self.length if old < fill else 0
            self.start[slot] += dropped
            fill -= old
            pcm = pcm[dropped - old :]
            n = pcm.size
        at = int(self.head[slot] + fill) % self.length
        first = min(n, self.length - at)
        row = self.buf[slot]
        row[at : at + first] = pcm[:first]
        row[: n - first] = pcm[first:]
        self.fill[slot] = fill + n
        return dropped

    def take(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The oldest frame of each of ``rows`` (each holds one) ``[len(rows), frame]``, and the gateway's
        frame index of each; the frames leave the buffers."""
        frames = self._frames[rows, self.head[rows] // self.frame]
        sources = self.start[rows] // self.frame
        self.head[rows] = (self.head[rows] + self.frame) % self.length
        self.fill[rows] -= self.frame
        self.start[rows] += self.frame
        return frames, sources

    def drop(self, rows: np.ndarray, samples: np.ndarray) -> None:
        """Forget the oldest ``samples`` (whole frames, at most what each holds) of each of ``rows``."""
        self.head[rows] = (self.head[rows] + samples) % self.length
        self.fill[rows] -= samples
        self.start[rows] += samples

    def move(self, src: int, dst: int) -> None:
        for a in (self.buf, self.head, self.fill, self.start):
            a[dst] = a[src]
