"""Which ready chunks a codec tick decodes: earliest playback deadline first, bulk work spread over ticks.

Why: the codec's decodes run on one CUDA stream, in launch order. A tick that launches every stream's
steady 25-frame chunk at once (64 x 25 frames is about 106 ms in fp32 on an H200) makes whatever is launched
after it wait that long, and right after its first audio a young stream has only one frame (80 ms) of audio
in hand. On the H200 the first serving underruns sat exactly there (docs/benchmarks.md, issue 14).

A stream's playback deadline is when a player that started at its first audio, with no prebuffer, runs dry:
the first audio's hand-out time plus the audio handed out since. A stream with no audio out yet is due when
it opened (first audio as early as possible, oldest first). A tick takes the ready chunks in deadline order:
each one whose slack (deadline - now) is under ``slack_s`` goes whatever it costs; the others go only while
the tick's frames stay within ``frame_budget``. The rest wait for a later tick, which comes as soon as this
one's decodes are collected. Nothing waits once its slack is under ``slack_s``, so under overload the rule
falls back to decoding everything at once, as ``fifo`` does.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from voxstage.codec.engine_state import StreamState

Work = list[tuple[StreamState, int]]  # (stream, frames to decode now)


def deadline(stream: StreamState, sample_rate: int) -> float:
    """When ``stream``'s player runs dry (perf_counter seconds); its open time before any audio is out."""
    if stream.first_out_at is None:
        return stream.opened_at
    return stream.first_out_at + stream.sample_offset / sample_rate


@dataclass(frozen=True)
class TickPolicy:
    mode: Literal["deadline", "fifo"] = "deadline"
    frame_budget: int = 400  # frames (context included) per tick for chunks that have slack
    slack_s: float = 0.25  # a chunk with less slack than this is never deferred

    def __post_init__(self) -> None:
        if self.mode not in ("deadline", "fifo"):
            raise ValueError(f"tick policy mode must be 'deadline' or 'fifo', got {self.mode!r}")
        if self.frame_budget < 1:
            raise ValueError(f"frame_budget must be >= 1, got {self.frame_budget}")
        if self.slack_s <= 0:
            raise ValueError(f"slack_s must be > 0, got {self.slack_s}")

    def pick(
        self, work: Work, now: float, sample_rate: int, frames: Callable[[StreamState, int], int]
    ) -> Work:
        """The part of ``work`` to decode this tick, most urgent first; ``frames`` is what a chunk costs."""
        if self.mode == "fifo":
            return work
        chosen: Work = []
        used = 0
        for stream, n in sorted(work, key=lambda item: deadline(item[0], sample_rate)):
            cost = frames(stream, n)
            urgent = deadline(stream, sample_rate) - now < self.slack_s
            # A tick always makes progress: its most urgent chunk goes even when it alone is over budget.
            if not chosen or urgent or used + cost <= self.frame_budget:
                chosen.append((stream, n))
                used += cost
        return chosen
