"""Duplex talker engine: every live session steps one frame per tick, all sessions in one batched step.

Model-agnostic; a family plugs in through ``DuplexAdapter`` (PersonaPlex's adapter, in its family folder).
Owned by one thread (``voxstage.stage.engine_loop``); imports no gRPC.

A session joins with a prompt (voice, persona) that is **prefilled** in chunks under the per-tick token
budget, interleaved with the live sessions' steps, so a join never stalls the others for more than one
call; sessions joining together share their calls (one batched prefill per common offset). Then each step
consumes one user frame (Mimi codes from the codec) and yields one agent frame.

The codec owns the 80 ms clock and sends every session's user frame of a tick at once; the engine steps when
every decoding session has its next frame, or when the oldest waiting frame is ``gather_s`` old (a late
session then joins the next step). A session whose queue still holds more than ``max_backlog`` frames when
it steps drops the oldest (counted), so its input never lags behind real time. Slots are packed: when a
session leaves, the last one moves into its hole, and a step runs over slots ``[0, n)``.
"""

from __future__ import annotations

import enum
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from services.talker.adapter import refuse_kv_cache_dtype
from services.talker.sampling import SamplingParams
from voxstage import metrics
from voxstage.config import DuplexSessionConfig
from voxstage.duplex import DuplexAdmissionError
from voxstage.stage.engine_loop import Steppable
from voxstage.stage.faults import each_alone_on_failure, one_line

log = logging.getLogger(__name__)


class DuplexAdapter(Protocol):
    num_groups: int
    codebook_size: int

    def allocate(self, num_slots: int, window: int) -> None: ...

    def prepare(self, *, persona: str, voice: str | None, voice_codes: np.ndarray | None) -> Any:
        """The session's prompt (opaque; ``.length`` positions, the last one the first decode input)."""
        ...

    def admit(self, slot: int, *, seed: int, text: SamplingParams, audio: SamplingParams) -> None: ...

    def prefill_many(self, chunks: Sequence[tuple[int, Any, int, int]]) -> None:
        """Chunks ``(slot, prompt, start, n)`` of joining sessions, written into their slots' caches."""
        ...

    def start_decode(self, slot: int, prompt: Any) -> None: ...

    def set_user(self, slots: Sequence[int], codes: np.ndarray) -> None: ...

    def step(
        self, active: Sequence[bool], max_position: int, all_greedy: bool = False
    ) -> tuple[np.ndarray, np.ndarray]:
        """One frame for slots ``[0, len(active))``: ``tokens [n, 1 + G]`` (text, codes) and ``valid [n]``."""
        ...

    def move_slot(self, src: int, dst: int, kv_len: int) -> None: ...

    def transcript(self, token: int) -> str: ...

    def kv_bytes_per_position(self) -> int:
        """KV bytes one session's ring takes per position (the talker's memory budget)."""
        ...

    # -- optional, with defaults -------------------------------------------------------------------------
    def use_kv_cache_dtype(self, name: str) -> None:
        """The deploy's ``kv_cache_dtype`` (``auto`` or ``fp8``), before ``allocate`` and
        ``kv_bytes_per_position``; raises ValueError, with the reason, for a value it cannot store."""
        refuse_kv_cache_dtype(name)

    def prompt_overhead(self) -> int | None:
        """The most prompt positions a session takes besides its persona's tokens and its voice recording's
        frames (``services.talker.budget``); None: the family cannot say."""
        return None

    def enable_cuda_graphs(self) -> bool:
        """Run the frame step from CUDA graphs from now on; False when the family has none (eager)."""
        return False

    def capture_all_graphs(self) -> int:
        """Capture every graph before serving (no session running); returns how many."""
        return 0


@dataclass(frozen=True)
class DuplexConfig:
    max_sessions: int
    window: int  # positions of each session's attention window (the ring; a call outlives it)
    prefill_budget: int  # prompt positions prefilled per tick, over all joining sessions
    gather_s: float = 0.010
    # Prefill work per step before the live sessions' step goes first: duplex_session.join_prefill_ms.
    prefill_time_s: float = DuplexSessionConfig.model_fields["join_prefill_ms"].default / 1e3
    max_backlog: int = 2
    input_queue: int = 25  # user frames a session may have in flight (the codec's credit)


@dataclass
class DuplexRequest:
    session_id: str
    persona: str
    voice: str | None
    voice_codes: np.ndarray | None
    seed: int
    text: SamplingParams
    audio: SamplingParams


class Finish(enum.StrEnum):
    CLOSED = "closed"
    CANCELLED = "cancelled"
    ERROR = "error"  # the session's part of a step failed (recover); its listener already heard why


@dataclass
class DuplexOutput:
    session_id: str
    frame: int  # agent frame index (0: the prompt's last frame, the first output)
    tokens: np.ndarray  # [1 + G]: text token, then the agent codebooks
    transcript: str
    user_frame: int  # index of the user frame the step consumed; -1: the prompt's own step
    consumed: int  # user frames taken off the queue by this step (consumed or dropped)
    finish: Finish | None = None


@dataclass
class _Session:
    request: DuplexRequest
    prompt: Any
    slot: int
    prefilled: int = 0
    decoding: bool = False
    first_step: bool = True  # the first free step feeds the prompt's own user frame
    position: int = 0  # absolute position of the next step
    frames_out: int = 0
    user_next: int = 0  # index of the next user frame to arrive
    queue: deque[tuple[int, np.ndarray, float]] = field(default_factory=deque)  # (index, codes, arrived)
    closing: bool = False
    admitted: float = 0.0  # the engine's clock at admission (the prefill wait's start)

    @property
    def prefill_target(self) -> int:
        return int(self.prompt.length) - 1


class DuplexEngine(Steppable[DuplexOutput]):
    def __init__(
        self, adapter: DuplexAdapter, config: DuplexConfig, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.adapter = adapter
        self.cfg = config
        self.clock = clock
        adapter.allocate(config.max_sessions, config.window)
        self._slots: list[_Session] = []
        self._by_id: dict[str, _Session] = {}
        self._cancelled: list[str] = []
        self._working: list[_Session] = []  # the sessions the adapter call under way works on (recover)
        self._partial: list[DuplexOutput] = []
        self.ticks = 0
        self.steps = 0
        self.dropped_frames = 0
        metrics.SLOTS_TOTAL.labels(stage="talker").set(config.max_sessions)

    # -- commands (engine thread) ----------------------------------------------------------------------
    def open(self, request: DuplexRequest) -> None:
        if request.session_id in self._by_id:
            raise ValueError(f"session {request.session_id!r} is already open")
        # Build the prompt before admission control: a bad persona or voice is the caller's error.
        prompt = self.adapter.prepare(
            persona=request.persona, voice=request.voice, voice_codes=request.voice_codes
        )
        if prompt.length > self.cfg.window:
            raise ValueError(
                f"the prompt (voice + persona) is {prompt.length} frames; the window holds {self.cfg.window}"
            )
        if len(self._slots) >= self.cfg.max_sessions:
            raise DuplexAdmissionError(f"all {self.cfg.max_sessions} talker slots hold live sessions")
        session = _Session(request, prompt, slot=len(self._slots), admitted=self.clock())
        self.adapter.admit(session.slot, seed=request.seed, text=request.text, audio=request.audio)
        self._slots.append(session)
        self._by_id[request.session_id] = session
        self._gauges()

    def push_user(self, session_id: str, first_index: int, codes: np.ndarray) -> None:
        """User frames ``codes [n, G]`` (indices ``first_index ...``), in order, within the credit."""
        s = self._get(session_id)
        if first_index != s.user_next:
            raise ValueError(f"user_codes: expected frame {s.user_next}, got {first_index}")
        if len(s.queue) + len(codes) > self.cfg.input_queue:
            raise ValueError(f"user_codes: more than the granted {self.cfg.input_queue} frames in flight")
        now = self.clock()
        for i, row in enumerate(np.asarray(codes, np.int64)):
            s.queue.append((first_index + i, row, now))
        s.user_next += len(codes)

    def close(self, session_id: str) -> None:
        """End of input: the session leaves at the next tick boundary."""
        self._get(session_id).closing = True

    def cancel(self, session_id: str) -> bool:
        if session_id not in self._by_id:
            return False
        self._cancelled.append(session_id)
        return True

    # -- introspection -----------------------------------------------------------------------------------
    def sessions(self) -> int:
        return len(self._slots)

    def session_state(self, session_id: str) -> str:
        s = self._by_id.get(session_id)
        if s is None:
            return "absent"
        return "decode" if s.decoding else "prefill"

    def slot_of(self, session_id: str) -> int:
        s = self._by_id.get(session_id)
        return -1 if s is None else s.slot

    def has_work(self) -> bool:
        if self._cancelled or any(s.closing for s in self._slots):
            return True
        if any(not s.decoding for s in self._slots):
            return True
        return self._due(self.clock())

    def idle_timeout(self) -> float | None:
        """Seconds until a step may be due with nothing new arriving (the gather deadline)."""
        waiting = [s.queue[0][2] for s in self._slots if s.decoding and s.queue]
        if not waiting:
            return None
        return max(0.0, min(waiting) + self.cfg.gather_s - self.clock())

    def _ready(self, s: _Session) -> bool:
        return s.decoding and (s.first_step or bool(s.queue))

    def _due(self, now: float) -> bool:
        live = [s for s in self._slots if s.decoding]
        if not any(self._ready(s) for s in live):
            return False
        if all(self._ready(s) for s in live):
            return True
        oldest = min((s.queue[0][2] for s in live if s.queue), default=now)
        return now - oldest >= self.cfg.gather_s

    # -- the tick ------------------------------------------------------------------------------------------
    def step(self) -> list[DuplexOutput]:
        t0 = time.perf_counter()
        outputs: list[DuplexOutput] = []
        self._partial = outputs  # what a failing tick already produced: recover hands it out
        for sid in self._cancelled:
            if sid in self._by_id:
                outputs.append(self._leave(self._by_id[sid], Finish.CANCELLED))
        self._cancelled.clear()
        for s in [s for s in self._slots if s.closing]:
            outputs.append(self._leave(s, Finish.CLOSED))
        # Prefill before the step, so a session whose prompt ends here speaks in this tick. The other order
        # (the live sessions' step first) was measured on the H200 and lost: at 64 joining sessions first
        # audio 0.39 -> 0.67 s p50 and 8 -> 29 late frames, at 128 (fp8) 2,759 -> 3,804 (docs/benchmarks.md).
        self._prefill()
        if self._due(self.clock()):
            outputs += self._decode()
        self.ticks += 1
        self._gauges()
        metrics.STAGE_TICK.labels(stage="talker").observe(time.perf_counter() - t0)
        return outputs

    def _prefill(self) -> None:
        # Two bounds: the deploy file's positions per tick, and time, so that a burst of joins delays the live
        # sessions' next step by at most about `prefill_time_s` (each prefill call costs a few ms of launches
        # whatever its length). At least one call always runs, so joins always progress. A call takes every
        # joining session at the oldest one's offset, up to the shortest prompt left among them, as one
        # batch: a burst of joins shares its launches, and what is left stays aligned for the next call.
        budget = self.cfg.prefill_budget
        t0 = time.perf_counter()
        while budget > 0:
            pending = [s for s in self._slots if not s.decoding]
            if not pending or (
                budget < self.cfg.prefill_budget and time.perf_counter() - t0 > self.cfg.prefill_time_s
            ):
                break
            start = pending[0].prefilled
            batch = [s for s in pending if s.prefilled == start]
            whole = min(s.prefill_target - start for s in batch)
            if budget < min(whole, self.cfg.prefill_budget):
                # Not a sliver of a prompt to use up the budget: a 7B call is launch-bound (H200: 15 ms for
                # one session's 59 positions, 19 ms for eight), so it would delay the live step as a full
                # call does. A prompt longer than the whole budget is still split, one budget a step.
                break
            n = min(whole, budget)
            batch = batch[: max(1, budget // n)] if n > 0 else batch
            if n > 0:
                chunks = [(s.slot, s.prompt, start, n) for s in batch]
                each_alone_on_failure(self.adapter.prefill_many, chunks, batch, self._set_working)
                budget -= n * len(batch)
                metrics.PREFILL_TOKENS.labels(source="computed").inc(n * len(batch))
            for s in batch:
                s.prefilled += n
                if s.prefilled >= s.prefill_target:
                    self._working = [s]  # a failing start belongs to its session alone
                    self.adapter.start_decode(s.slot, s.prompt)
                    s.decoding = True
                    metrics.DUPLEX_PREFILL_WAIT.observe(self.clock() - s.admitted)
                    s.position = s.prefill_target
        self._working = []

    def _set_working(self, sessions: list[_Session]) -> None:
        self._working = sessions

    def _decode(self) -> list[DuplexOutput]:
        n = len(self._slots)
        active = [self._ready(s) for s in self._slots]
        self._working = [s for s, a in zip(self._slots, active, strict=True) if a]
        rows: list[int] = []
        frames: list[np.ndarray] = []
        taken: dict[int, tuple[int, int]] = {}  # slot -> (user frame index, frames taken off the queue)
        for s, a in zip(self._slots, active, strict=True):
            if not a:
                continue
            if s.first_step:
                taken[s.slot] = (-1, 0)  # the prompt set this step's user frame
                continue
            drop = max(0, len(s.queue) - self.cfg.max_backlog)
            for _ in range(drop):
                s.queue.popleft()
            self.dropped_frames += drop
            if drop:
                metrics.DUPLEX_DROPPED_USER_FRAMES.inc(drop)
            index, codes, _ = s.queue.popleft()
            rows.append(s.slot)
            frames.append(codes)
            taken[s.slot] = (index, drop + 1)
        if rows:
            self.adapter.set_user(rows, np.stack(frames))
        max_position = max(s.position for s, a in zip(self._slots, active, strict=True) if a)
        greedy = all(not (s.request.text.do_sample or s.request.audio.do_sample) for s in self._slots)
        tokens, valid = self.adapter.step(active, max_position, all_greedy=greedy)
        self.steps += 1
        outputs = []
        for s, a in zip(self._slots[:n], active, strict=True):
            if not a:
                continue
            s.first_step = False
            s.position += 1
            user_frame, consumed = taken[s.slot]
            if not valid[s.slot]:
                continue
            row = tokens[s.slot]
            outputs.append(
                DuplexOutput(
                    s.request.session_id,
                    s.frames_out,
                    row.copy(),
                    self.adapter.transcript(int(row[0])),
                    user_frame,
                    consumed,
                )
            )
            s.frames_out += 1
        self._working = []
        return outputs

    def recover(self, exc: Exception) -> tuple[list[str], list[DuplexOutput]]:
        """``step`` raised ``exc`` (not a device failure): the sessions the failed call worked on (all when
        unknown) leave; returns their ids and what the tick had produced for the others."""
        failed = self._working or list(self._slots)
        self._working = []
        ids = []
        for s in sorted(failed, key=lambda s: -s.slot):  # last slot first: nobody else's state moves
            sid = s.request.session_id
            if self._by_id.get(sid) is s:
                log.error("talker: duplex session %s ended: %s", sid, one_line(exc))
                self._leave(s, Finish.ERROR)
                ids.append(sid)
        self._gauges()
        return ids, [o for o in self._partial if o.session_id not in ids]

    def _leave(self, s: _Session, why: Finish) -> DuplexOutput:
        sid = s.request.session_id
        self._by_id.pop(sid, None)
        hole, last = s.slot, len(self._slots) - 1
        if hole != last:
            mover = self._slots[last]
            self.adapter.move_slot(last, hole, mover.position if mover.decoding else mover.prefilled)
            mover.slot = hole
            self._slots[hole] = mover
        self._slots.pop()
        metrics.STAGE_REQUESTS.labels(stage="talker", finish=why.value).inc()
        empty = np.zeros(1 + self.adapter.num_groups, np.int64)
        return DuplexOutput(sid, s.frames_out, empty, "", -1, len(s.queue), finish=why)

    def _get(self, session_id: str) -> _Session:
        try:
            return self._by_id[session_id]
        except KeyError:
            raise KeyError(f"no live duplex session {session_id!r}") from None

    def _gauges(self) -> None:
        metrics.SLOTS_IN_USE.labels(stage="talker").set(len(self._slots))
        metrics.ACTIVE_STREAMS.labels(stage="talker").set(len(self._slots))
        metrics.QUEUE_DEPTH.labels(stage="talker").set(0)
