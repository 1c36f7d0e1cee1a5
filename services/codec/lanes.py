"""Two decode lanes for the codec engine (the deploy file's ``codec_urgent_lane_ms``): young streams' chunks
on a high-priority CUDA stream, everything else in large ticks on a low-priority one.

Why: with one lane the tick budget is a trade. At 256 paced Qwen3-TTS streams on an H100 (docs/benchmarks.md,
seventeenth session) 20 ms ticks made calls of 68 frame rows on average, 140 us of device time a row against
76 us in a 1,024-row call, and the codec took half the GPU; 40 ms ticks made calls of 151-169 rows but a young
stream's ramp chunk then waited behind a 40 ms tick, and the closed search fell from 128 gap-free streams to
48. The chunks with no slack are a stream's first chunk (and its reference prefix) and its ramp chunks (each
as long as all the audio before it, so due within that much); steady chunks run two seconds ahead when the
stream keeps up. So they are split:

* the **urgent lane** takes the first, prefix and ramp chunks (a stream with no audio out yet, or one whose
  next chunk is shorter than ``steady_frames`` by the schedule: not a short last chunk), in deadline order, in
  ticks of at most ``codec_urgent_lane_ms`` of estimated device time, on a CUDA stream of the highest
  priority: the GPU's block scheduler starts its kernels' blocks ahead of the bulk lane's as SMs free up, so a
  ramp chunk waits for a kernel's tail, not for a tick (a CUDA graph runs at the priority of the stream it is
  launched into). Its calls are a few rows, bound by their chain of short kernels more than by arithmetic, so
  beside a bulk call they take little of its SM time, where on one stream they held the device alone;
* the **bulk lane** takes the rest under the engine's own policy and ``codec_tick_budget_ms`` (fifo, or
  deadline ticks that can now be larger), on a CUDA stream of the lowest priority.

Each lane keeps at most ``DEPTH`` ticks launched (one running, one queued behind it) and its own decode calls:
the graphs' static inputs, memory pool and cuBLAS workspace cannot be shared by two decodes running at once
(a lane's graphs are captured on its own CUDA stream: graphs captured on one stream share its workspace,
which wedged the codec on an H100 when both lanes ran GEMMs in it at once). A stream's decodes
stay on one lane while any is in flight (a ramp chunk may follow its previous one on the urgent lane, as in
the one-lane engine), so a slot's decodes run in launch order. Ticks are collected as they finish, never
waited for: the engine thread polls (``idle_timeout``), so an urgent chunk that arrives while a bulk tick runs
launches at once. A stream cancelled with a decode in flight keeps its slot until that decode is collected:
the next stream given the slot could otherwise reset it under the other lane's running decode. Padding rows
use the top of the scratch slots on the urgent lane and the bottom on the bulk lane (``CodecEngine._launch``).

The same audio as one lane, as between the tick policies (the tests compare both with the offline decode at
1e-5): which call a row shares does not change it (``lengths`` keeps padding out), and ramp chunks still
decode one per tick. Off a GPU there are no streams: the lanes take turns, decode by
decode (what the CPU tests exercise).
"""

from __future__ import annotations

import contextlib
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from services.codec.calls import Bucket, DecodeCalls
from services.codec.engine import CodecEngine, CodecOutput, StreamingCodec
from services.codec.engine_state import Launched, StreamState
from services.codec.schedule import Call, Row, batch_bucket, deadline_calls, fifo_calls
from voxstage import metrics
from voxstage.stage.faults import DeviceStalled

DEPTH = 2  # launched ticks a lane holds: one running on the device, the next queued behind it
POLL_S = 0.0005  # how often the engine thread looks for a finished tick while both lanes are busy
# A lane's oldest decode still running after this long means a stuck kernel (the largest call takes well
# under a second): the stage restarts rather than serve silence (on an H100 both lanes' GEMMs once shared one
# cuBLAS workspace and a lane never finished again; every request after that ran out its deadline).
STALL_S = 10.0
# CUDA stream priorities: lower is more urgent; PyTorch clamps to the device's range.
URGENT_PRIORITY, BULK_PRIORITY = -100, 0


@dataclass
class Lane:
    name: str
    calls: DecodeCalls
    budget_s: float
    stream: torch.cuda.Stream | None  # None off a GPU
    inflight: deque[Launched] = field(default_factory=deque)  # its launched calls, oldest first
    ticks: deque[int] = field(default_factory=deque)  # how many of them each launched tick has left

    def has_room(self) -> bool:
        return len(self.ticks) < DEPTH

    def add_tick(self) -> None:
        self.ticks.append(0)

    def add_call(self, group: Launched) -> None:
        self.inflight.append(group)
        self.ticks[-1] += 1

    def end_tick(self) -> None:
        if self.ticks and not self.ticks[-1]:
            self.ticks.pop()  # its first launch failed: no call of it is owed

    def pop_done(self) -> Launched:
        """The oldest call, finished (``done_head``); its tick leaves with its last call."""
        self.ticks[0] -= 1
        if not self.ticks[0]:
            self.ticks.popleft()
        return self.inflight.popleft()

    def done_head(self) -> bool:
        return bool(self.inflight) and self.inflight[0].done()

    @contextlib.contextmanager
    def on_stream(self) -> Iterator[None]:
        if self.stream is None:
            yield
            return
        # Slot resets and voice-state restores go on the thread's own stream when a stream opens: run after.
        self.stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.stream):
            yield


class LanedCodecEngine(CodecEngine):
    """``CodecEngine`` with an urgent and a bulk lane (module docstring); needs async scheduling."""

    def __init__(
        self, codec: StreamingCodec, *, urgent_calls: DecodeCalls | None, urgent_budget_s: float, **kw: Any
    ) -> None:
        super().__init__(codec, **kw)
        if not self.async_scheduling:
            raise ValueError("codec lanes collect decodes as they finish: they need async scheduling")
        if urgent_budget_s <= 0:
            raise ValueError(f"urgent_budget_s must be > 0, got {urgent_budget_s}")
        cuda = self.device.type == "cuda"

        def stream(priority: int) -> torch.cuda.Stream | None:
            return torch.cuda.Stream(self.device, priority=priority) if cuda else None

        self.urgent = Lane("urgent", urgent_calls or DecodeCalls(codec.decode), urgent_budget_s,
                           stream(URGENT_PRIORITY))  # fmt: skip
        self.bulk = Lane("bulk", self.calls, self.tick_budget_s, stream(BULK_PRIORITY))
        self.lanes = (self.urgent, self.bulk)
        for lane in self.lanes:
            if lane.stream is not None:
                lane.calls.capture_on(lane.stream)  # its own cuBLAS workspace (DecodeCalls.capture_on)
        self._lane_of: dict[int, Lane] = {}  # id(stream) -> the lane its decodes in flight are on
        self._draining: list[StreamState] = []  # cancelled with a decode in flight: slot not free yet
        self._idle_known = False  # has_work's stream scan found nothing, and nothing changed since

    # -- commands: each may give a stream something to decode ------------------------------------------------
    def open(self, stream_id: str, **kw: Any) -> int:
        self._idle_known = False
        return super().open(stream_id, **kw)

    def push(self, stream_id: str, codes: np.ndarray) -> None:
        self._idle_known = False
        super().push(stream_id, codes)

    def end_segment(self, stream_id: str) -> None:
        self._idle_known = False
        super().end_segment(stream_id)

    def finish(self, stream_id: str) -> None:
        self._idle_known = False
        super().finish(stream_id)

    # -- the engine loop -------------------------------------------------------------------------------------
    def has_work(self) -> bool:
        """A lane's oldest tick has finished, or a stream has a chunk its lane has room for, or output owed.
        Called between polls: the stream scan runs only after something changed."""
        if any(lane.done_head() for lane in self.lanes):
            return True
        self._check_stalled()
        if self._idle_known:
            return False
        for s in self._streams.values():
            if not s.in_flight and (s.drained() or s.mark_due()):
                return True
            lane = self._row_lane(s)
            if lane is not None and lane.has_room():
                return True
        self._idle_known = True
        return False

    def idle_timeout(self) -> float | None:
        return POLL_S if any(lane.inflight for lane in self.lanes) else None

    def step(self) -> list[CodecOutput]:
        outputs: list[CodecOutput] = []
        self._partial = outputs
        self._idle_known = False
        t0 = time.perf_counter()
        for lane in self.lanes:
            while lane.done_head():
                self._collect(lane.pop_done(), outputs)
        self._settle([s for s in self._streams.values() if not s.in_flight], outputs)
        launched = False
        for lane, rows in self._split(self._ready_rows(time.perf_counter())):
            if not rows or not lane.has_room():
                continue
            lane.add_tick()
            try:
                with lane.on_stream():
                    for call in self._plan_lane(lane, rows):
                        group = self._launch(call, lane.calls, top=lane is self.urgent)
                        lane.add_call(group)  # before the next launch: a failing one leaves it owed
                        for stream, _ in group.work:
                            self._lane_of[id(stream)] = lane
                        metrics.CODEC_LANE_CALLS.labels(lane.name).inc()
                        metrics.CODEC_LANE_ROWS.labels(lane.name).inc(
                            batch_bucket(len(call.rows), self.max_streams) * call.frames
                        )
            finally:
                lane.end_tick()
            launched = True
        return self._stepped(launched, t0, outputs)

    def _check_stalled(self) -> None:
        now = time.perf_counter()
        for lane in self.lanes:
            if lane.inflight and now - lane.inflight[0].launched_at > STALL_S:
                head = lane.inflight[0]
                raise DeviceStalled(
                    f"codec: the {lane.name} lane's decode of {len(head.work)} row(s), launched "
                    f"{now - head.launched_at:.0f} s ago, has not finished: the device is stuck"
                )

    # -- start-up --------------------------------------------------------------------------------------------
    @property
    def needs_cost(self) -> bool:
        # The urgent lane's ticks are bounded whatever the bulk policy; off a GPU they take every urgent row.
        return super().needs_cost or self.urgent.stream is not None

    def start_up_calls(self) -> list[tuple[DecodeCalls, Bucket]]:
        return [*super().start_up_calls(), (self.urgent.calls, self._urgent_call)]

    def _urgent_call(self, rows: int, frames: int) -> bool:
        return self.cost is None or rows == 1 or self.cost(rows, frames) <= self.urgent.budget_s

    # -- internals -------------------------------------------------------------------------------------------
    def _urgent(self, s: StreamState) -> bool:
        """A stream's first chunk (and reference prefix) and its ramp chunks, each due within as much audio
        as went before it. A short last chunk past the ramp goes bulk: its stream holds a steady chunk's
        audio, and on the urgent lane, behind every young stream's chunks, such ends waited past the
        gateway's 3 s stall timeout under overload (37 streams cut at 256 on an H100, twentieth session)."""
        return s.first_audio_at is None or self.schedule.ramping(s.scheduled, s.initial_frames)

    def _row_lane(self, s: StreamState) -> Lane | None:
        """The lane ``s``'s next chunk would go on now (None: nothing to decode now)."""
        n = self._chunk_now(s)
        return None if not n else self.urgent if self._urgent(s) else self.bulk

    def _follows(self, s: StreamState) -> bool:
        # A ramp chunk follows its decode in flight on the urgent lane only: one lane runs a slot's decodes
        # in launch order, two would not.
        return (
            s.in_flight == 1
            and self._lane_of.get(id(s)) is self.urgent
            and not (s.prefix_frames or s.marks or s.ended or s.voice is not None or self.left_context)
        )

    def _split(self, rows: list[Row[StreamState]]) -> list[tuple[Lane, list[Row[StreamState]]]]:
        by_lane: dict[str, list[Row[StreamState]]] = {"urgent": [], "bulk": []}
        for r in rows:
            by_lane["urgent" if self._urgent(r.stream) else "bulk"].append(r)
        return [(lane, by_lane[lane.name]) for lane in self.lanes]

    def _plan_lane(self, lane: Lane, rows: list[Row[StreamState]]) -> list[Call[StreamState]]:
        if lane is self.bulk:
            return self._plan(rows)
        if self.cost is None:
            return fifo_calls(rows, self.frame_buckets)
        calls, _ = deadline_calls(rows, self.frame_buckets, self.cost, lane.budget_s, self.max_streams)
        return calls

    def _in_flight_groups(self) -> list[Launched]:
        return [group for lane in self.lanes for group in lane.inflight]

    def _collect(self, launched: Launched, outputs: list[CodecOutput]) -> None:
        super()._collect(launched, outputs)
        for stream, _ in launched.work:
            if not stream.in_flight:
                self._lane_of.pop(id(stream), None)
        if self._draining:
            for s in [s for s in self._draining if not s.in_flight]:
                self._draining.remove(s)
                super()._release(s)

    def _release(self, stream: StreamState) -> None:
        if stream.in_flight:
            self._draining.append(stream)  # its slot is freed when that decode is collected
            return
        super()._release(stream)
