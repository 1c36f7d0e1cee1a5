"""``JitterRing`` (the duplex codec's user-audio buffers) against a plain list per session: random pushes of
any size, overflows, frames taken and dropped, with a capacity that is not whole frames (the seeds' 1 s of
24 kHz audio is 12.5 frames of 1920), so rows wrap at every phase."""

from __future__ import annotations

import numpy as np

from services.codec.duplex.jitter import JitterRing

FRAME, CAPACITY, SLOTS = 8, 30, 3


class Plain:
    """One session's buffer as a list of samples, with the gateway's sample index of its first."""

    def __init__(self) -> None:
        self.samples: list[float] = []
        self.start = 0

    def push(self, pcm: np.ndarray) -> int:
        self.samples += pcm.tolist()
        over = len(self.samples) - CAPACITY
        dropped = -(-over // FRAME) * FRAME if over > 0 else 0
        del self.samples[:dropped]
        self.start += dropped
        return dropped


def test_the_ring_keeps_what_a_plain_buffer_keeps() -> None:
    rng = np.random.default_rng(7)
    ring, plain = JitterRing(SLOTS, CAPACITY, FRAME), [Plain() for _ in range(SLOTS)]
    counter = 0
    for _ in range(3000):
        slot, op = int(rng.integers(SLOTS)), rng.random()
        if op < 0.5:
            n = int(rng.integers(0, CAPACITY + 1))
            pcm = np.arange(counter, counter + n, dtype=np.float32)
            counter += n
            assert ring.push(slot, pcm) == plain[slot].push(pcm)
        elif op < 0.85:
            rows = np.array([s for s in range(SLOTS) if len(plain[s].samples) >= FRAME], np.int64)
            if not rows.size:
                continue
            frames, sources = ring.take(rows)
            for i, s in enumerate(rows):
                assert frames[i].tolist() == plain[s].samples[:FRAME]
                assert sources[i] == plain[s].start // FRAME
                del plain[s].samples[:FRAME]
                plain[s].start += FRAME
        elif op < 0.95:
            held = len(plain[slot].samples) // FRAME
            k = int(rng.integers(0, held + 1)) * FRAME
            ring.drop(np.array([slot]), np.array([k]))
            del plain[slot].samples[:k]
            plain[slot].start += k
        else:
            ring.clear(slot)  # the session's input ended: what it held is forgotten where it stood
            plain[slot].samples = []
        for s in range(SLOTS):
            assert ring.fill[s] == len(plain[s].samples)
            assert ring.end(s) == plain[s].start + len(plain[s].samples)
            assert ring.head[s] % FRAME == 0  # the oldest frame never wraps
