"""A Talker.Stream's segments and takes (docs/api.md "Segments"), and the rule for how many frames go out.

A segment is the text between two flushes; once it may start it becomes a take: one engine request whose
frames go to the codec in whole chunks of the schedule, restarted for each take.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from services.talker.engine import Finish
from voxstage.chunking import whole_chunks
from voxstage.internal.v1 import stage_pb2

_REASONS = {
    Finish.EOS: stage_pb2.END_REASON_EOS,
    Finish.MAX_FRAMES: stage_pb2.END_REASON_MAX_FRAMES,
    Finish.MAX_MODEL_LEN: stage_pb2.END_REASON_MAX_FRAMES,
}


def sendable(
    sent: int, avail: int, credit: int, initial: int, steady: int, finished: bool, ramp: bool = True
) -> int:
    """Frames to put in the next CodecFrames: whole chunks of the schedule that fit the credit, or the
    whole remainder once generation has finished (never split to fit: the codec's window holds a chunk)."""
    if finished and avail <= credit:
        return avail
    return whole_chunks(sent, min(avail, credit), initial, steady, ramp)


@dataclass
class Segment:
    """Text between two flushes; it gets its index when its take starts (blank segments never do)."""

    parts: list[str] = field(default_factory=list)
    closed: bool = False

    @property
    def text(self) -> str:
        return "".join(self.parts)


@dataclass
class Take:
    """One segment's engine request and the frames it has produced but not yet sent."""

    index: int
    key: str
    segment: Segment
    fed: int  # characters of the segment's text handed to the engine
    complete: bool  # the engine has the whole text
    capped: bool  # the text-derived frame cap is the binding budget (MAX_FRAMES then means FRAME_CAP)
    sent: int = 0
    pending: list[np.ndarray] = field(default_factory=list)
    pending_frames: int = 0
    finish: Finish | None = None

    def reason(self) -> int:
        assert self.finish is not None
        if self.finish is Finish.MAX_FRAMES and self.capped:
            return stage_pb2.END_REASON_FRAME_CAP
        return _REASONS[self.finish]
