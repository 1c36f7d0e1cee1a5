"""Per-stream bookkeeping of ``CodecEngine``, its chunk schedule and its launched decodes (split out to keep
the engine short)."""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

import numpy as np
import torch

from voxstage import metrics
from voxstage.chunking import next_boundary, whole_chunks


@dataclass(frozen=True)
class ChunkSchedule:
    initial_frames: int
    steady_frames: int
    max_frames_per_decode: int = 100
    ramp: bool = True  # chunks grow from the first up to steady_frames (voxstage.chunking)

    def __post_init__(self) -> None:
        if not 1 <= self.initial_frames <= self.steady_frames:
            raise ValueError(
                f"chunk schedule needs 1 <= initial ({self.initial_frames}) <= steady ({self.steady_frames})"
            )
        if self.max_frames_per_decode < self.steady_frames:
            raise ValueError("max_frames_per_decode must be >= steady_frames")

    def ramping(self, emitted: int, initial: int) -> bool:
        """Whether the chunk after ``emitted`` frames is one of the ramp's (shorter than a steady chunk)."""
        return next_boundary(emitted, initial, self.steady_frames, self.ramp) - emitted < self.steady_frames

    def take(self, emitted: int, available: int, ended: bool, initial: int) -> int:
        """Frames to decode now for a stream that has ``emitted`` frames out and ``available`` buffered."""
        if available <= 0:
            return 0
        need = next_boundary(emitted, initial, self.steady_frames, self.ramp) - emitted
        if available < need:
            return available if ended else 0
        if emitted == 0 or need < self.steady_frames:
            # The first chunk alone (first audio as early as possible), and each chunk of the ramp alone even
            # when several are buffered: a merged decode's PCM is a bit off that of the same chunks decoded
            # one by one, so a request's audio would depend on when its frames came. One ramp chunk per tick
            # keeps up whenever the second chunk does (each is as long as all the audio before it).
            return need
        if ended and available <= self.max_frames_per_decode:
            return available
        # Past the ramp and behind the producer: every whole chunk that is ready, in one decode.
        limit = min(available, self.max_frames_per_decode)
        return whole_chunks(emitted, limit, initial, self.steady_frames, self.ramp)


@dataclass
class StreamState:
    stream_id: str
    slot: int
    initial_frames: int
    pending: list[np.ndarray] = field(default_factory=list)
    pending_frames: int = 0
    emitted_frames: int = 0
    received: int = 0  # frames pushed (reference prefix excluded)
    segment_emitted: int = 0  # frames decoded since the last segment mark: where the chunk schedule stands
    marks: deque[int] = field(default_factory=deque)  # `received` counts at which segments end
    prefix_frames: int = 0  # decoded for state only (voice-clone reference codes); their audio is dropped
    history: np.ndarray | None = None  # overlap+crop: the last left_context frames, decoded again each chunk
    voice: tuple[str, np.ndarray] | None = None  # (voice key, prefix): its state is kept once decoded
    sample_offset: int = 0
    ended: bool = False
    in_flight: int = 0  # launched decodes of this stream not collected yet
    flight_frames: int = 0  # the frames in them
    opened_at: float = field(default_factory=time.perf_counter)
    first_audio_at: float | None = None  # when its first audio was read back (perf_counter s)
    ready_since: float | None = None  # when its ready frames began to wait for a decode (deadline policy)
    # (frames put in so far, reference prefix included, when): one per push, until its frames are taken
    arrivals: deque[tuple[int, float]] = field(default_factory=deque)
    # When a no-prebuffer player of the stream's audio runs dry (it starts at the first chunk and, like a
    # real one, resumes where a late chunk finds it); None before the first chunk and after a segment's end.
    dry_at: float | None = None
    put: int = 0  # frames put in (prefix included)
    taken: int = 0  # frames taken for decodes (prefix included)

    def add(self, codes: np.ndarray, now: float) -> None:
        """Buffer ``codes`` (frames the talker sent, or the reference prefix), arrived at ``now``."""
        self.pending.append(codes)
        self.pending_frames += codes.shape[0]
        self.put += codes.shape[0]
        self.arrivals.append((self.put, now))

    def observe_chunk(self, steady: bool, seconds: float, ready: float, launched: float, now: float) -> None:
        """The chunk metrics (docs/api.md, Metrics) for a chunk of ``seconds`` of audio handed out ``now``,
        its frames all in at ``ready`` and its decode launched at ``launched``: how long they waited in the
        codec and how much of that was the decode, and whether the stream's player ran dry before it and
        why (its frames came after that, or the codec held them)."""
        if self.dry_at is None:
            kind, self.dry_at = "first", now
        else:
            kind = "steady" if steady else "short"
            if now > self.dry_at:
                cause = "frames" if ready > self.dry_at else "codec"
                metrics.CODEC_LATE_CHUNKS.labels(cause=cause).observe(now - self.dry_at)
        self.dry_at = max(self.dry_at, now) + seconds
        metrics.CODEC_CHUNK_WAIT.labels(chunk=kind).observe(now - ready)
        metrics.CODEC_CHUNK_DECODE.labels(chunk=kind).observe(now - launched)

    def mark_due(self) -> bool:
        """Whether the segment mark ahead is reached: its frames are all decoded (no prefix left)."""
        return bool(self.marks) and self.prefix_frames == 0 and self.marks[0] == self.emitted_frames

    def pass_mark(self) -> None:
        self.marks.popleft()
        self.segment_emitted = 0
        self.dry_at = None  # the gateway's player restarts with the next segment

    @property
    def scheduled(self) -> int:
        """Where the chunk schedule stands for the next decode: frames in flight count as out (the chunk
        after them is the one a follower decodes, ``CodecEngine._follows``)."""
        return self.segment_emitted + self.flight_frames

    def drained(self) -> bool:
        """Input ended, every frame decoded and handed out, no mark or decode left."""
        return self.ended and self.pending_frames == 0 and not self.marks and not self.in_flight

    def take(self, n: int) -> tuple[np.ndarray, float]:
        """The next ``n`` buffered frames, and when the last of them arrived (the chunk's frames all in)."""
        buf = np.concatenate(self.pending, axis=0) if len(self.pending) > 1 else self.pending[0]
        out, rest = buf[:n], buf[n:]
        self.pending = [rest] if rest.shape[0] else []
        self.pending_frames -= n
        self.taken += n
        while self.arrivals[0][0] < self.taken:
            self.arrivals.popleft()
        # The first push that reaches the chunk's last frame brought it; gone once all its frames are taken.
        put, ready = self.arrivals[0]
        if put == self.taken:
            self.arrivals.popleft()
        return out, ready


@dataclass
class Launched:
    """One bucket's decode, launched: ``pcm`` (host) holds its audio once ``event`` has completed."""

    work: list[tuple[StreamState, int]]
    contexts: list[int]
    pcm: torch.Tensor  # [b_real, samples] float32
    event: torch.cuda.Event | None
    ready: list[float]  # per row: when its frames were all in (perf_counter s), for the chunk metrics
    launched_at: float  # when the decode was launched (perf_counter s), for the chunk metrics

    def done(self) -> bool:
        """Whether the audio is on the host (never blocks)."""
        return self.event is None or self.event.query()


def read_back(wav: torch.Tensor) -> tuple[torch.Tensor, torch.cuda.Event | None]:
    """Start copying ``wav`` to the host without blocking: the returned event completes when it is there."""
    if wav.device.type != "cuda":
        return wav.float().clone(), None  # a copy: graph and decoder outputs are reused buffers
    # Pinned memory: a copy from device to pageable memory blocks the host until the decode is done.
    host = torch.empty(wav.shape, dtype=torch.float32, pin_memory=True)
    host.copy_(wav.float(), non_blocking=True)
    event = torch.cuda.Event()
    event.record()
    return host, event


def count_rows(work: list[tuple[StreamState, int]], contexts: list[int], computed: int) -> None:
    """A launched call's frame rows by part (``voxstage_codec_decode_frames_total``): of the ``computed``
    rows (batch bucket x frame bucket), the rows' new frames (a reference prefix's, or audio), their
    context, and the padding; what says how much of the codec's device time bought audio."""
    prefix = sum(n for stream, n in work if stream.prefix_frames)
    new = sum(n for _, n in work)
    context = sum(contexts)
    part = metrics.CODEC_DECODE_PART
    part["audio"].inc(new - prefix)
    if prefix:
        part["prefix"].inc(prefix)
    if context:
        part["context"].inc(context)
    part["padding"].inc(computed - new - context)
    metrics.CODEC_DECODE_CALLS.inc()
