"""Where a take's codec frames are cut into audio chunks: the one rule the talker, codec and config share.

The first chunk holds ``initial`` frames. With the ramp (``codec_chunk_ramp: true``, the default) each later
chunk is as long as all the audio before it (so the total doubles) until it reaches ``steady``; without it
every later chunk is ``steady``. Seed schedule 1 then 25: chunks of 1, 1, 2, 4, 8, 16, 25, 25, ... frames.

Why the ramp: with immediate playback a chunk must be ready before the audio already out has played. A jump
from 1 frame straight to 25 needs the talker to make 25 frames in the 80 ms the first frame plays (a 3.2 ms
frame step). A chunk no longer than the audio before it is made while that audio plays for any frame step up
to about 40 ms, and the riskiest one, right after the first audio, needs a single frame within 80 ms: a
frame step plus any jitter between the first two chunks. (Doubling each chunk instead, 1, 2, 4, ..., asked
two frames of that first gap; under load the H200 serving runs underran exactly there.) Later chunks are
still the large steady ones, so the codec's per-call cost is amortised.
"""

from __future__ import annotations


def next_boundary(done: int, initial: int, steady: int, ramp: bool = True) -> int:
    """The first chunk boundary after ``done`` frames (a frame count > ``done``)."""
    if not 1 <= initial <= steady:
        raise ValueError(f"chunk schedule needs 1 <= initial ({initial}) <= steady ({steady})")
    boundary, size = initial, initial
    while boundary <= done and size < steady:
        size = min(steady, boundary) if ramp else steady
        boundary += size
    if boundary <= done:  # past the ramp: a boundary every `steady` frames
        boundary += ((done - boundary) // steady + 1) * steady
    return boundary


def whole_chunks(done: int, limit: int, initial: int, steady: int, ramp: bool = True) -> int:
    """Frames after ``done`` up to the last chunk boundary within ``limit`` more frames (0 if none fits)."""
    end = done
    while (nxt := next_boundary(end, initial, steady, ramp)) - done <= limit:
        end = nxt
    return end - done


def chunk_sizes(initial: int, steady: int, ramp: bool = True) -> list[int]:
    """The distinct chunk sizes of a schedule, smallest first (codec graph buckets)."""
    sizes, done = set(), 0
    while True:
        size = next_boundary(done, initial, steady, ramp) - done
        sizes.add(size)
        done += size
        if size == steady:
            return sorted(sizes)
