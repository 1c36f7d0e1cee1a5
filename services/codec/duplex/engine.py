"""Duplex codec engine (docs/protocol.md §11): the 80 ms clock, user audio -> Mimi codes, agent codes -> PCM.

Owned by one thread (``voxstage.stage.engine_loop``); imports no gRPC. Every session holds one slot of a
Mimi slot pool with an encode state (the user's audio) and a decode state (the agent's codes). Slots are
**packed**: sessions hold ``[0, n)``, and when one leaves, the last one moves into its hole, so each batched
call runs over the rows ``[0, B)`` (``B`` the next power of two, capped at ``max_sessions``) with padding rows
of length 0. The pool's slot ``max_sessions`` encodes voice recordings.

The clock: at every tick (a grid of ``tick_s`` from the first live session's start), every live session
contributes exactly one user frame, the oldest complete frame of its jitter buffer or silence, and all of
them are encoded in one call. A session is never stalled by a slow client, and late audio is simply the
next frame. Grid points the engine itself was too late for are skipped and their audio dropped, so a stall
of the engine adds no lasting delay. Agent frames from the talker are gathered until every session sent a
frame this tick has answered, or for ``gather_s``, and decoded in one call, so one talker step's frames
decode together. An agent frame is late when its PCM leaves after its tick's start plus one tick.
"""

from __future__ import annotations

import concurrent.futures
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from services.codec.duplex.calls import PackedCalls, move_session_state
from services.codec.duplex.jitter import JitterRing
from services.codec.duplex.reference import ReferenceJobs
from services.codec.duplex.types import (
    AgentAudio,
    AgentFrame,
    DuplexCodecConfig,
    DuplexOutput,
    SessionInfo,
    UserCodes,
)
from services.codec.engine import batch_bucket
from voxstage import metrics
from voxstage.duplex import DuplexAdmissionError
from voxstage.stage.engine_loop import Steppable, log_capture
from voxstage.stage.faults import one_line

log = logging.getLogger(__name__)


@dataclass
class _Session:
    """What a session keeps outside the per-slot arrays (its jitter buffer is a row of ``JitterRing``; live,
    freed samples and underflows are arrays by slot, for the tick's array ops)."""

    sid: str
    slot: int
    input_ended: bool = False
    sent: int = 0  # user frames sent to the talker
    # (talker user frame, gateway frame or -1, tick start) of every user frame not yet answered
    records: deque[tuple[int, int, float]] = field(default_factory=deque)
    pending: deque[AgentFrame] = field(default_factory=deque)
    late: int = 0
    dropped_samples: int = 0


class DuplexCodecEngine(Steppable[DuplexOutput]):
    """Call methods only from the engine thread. ``clock`` (seconds, monotonic) is injectable for tests."""

    def __init__(
        self,
        codec: Any,
        config: DuplexCodecConfig,
        *,
        calls: Any = None,
        device: torch.device | str = "cpu",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if codec.max_streams < config.max_sessions + 1:
            raise ValueError(
                f"codec pool has {codec.max_streams} slots; {config.max_sessions} sessions need "
                f"{config.max_sessions + 1} (the last one encodes voice recordings)"
            )
        self.codec = codec
        self.cfg = config
        self.device = torch.device(device)
        self.clock = clock
        self.spf: int = codec.samples_per_frame
        self.groups: int = codec.num_codebooks
        self.sample_rate: int = codec.sample_rate
        if config.jitter_samples < self.spf:
            raise ValueError(f"jitter_samples must hold one frame ({self.spf}), got {config.jitter_samples}")
        self.calls = calls if calls is not None else PackedCalls(codec)
        self.references = ReferenceJobs(
            codec, config.max_sessions, config.reference_chunk_frames, self.device, clock
        )
        slots = config.max_sessions
        self.ring = JitterRing(slots, config.jitter_samples, self.spf)
        self._live = np.zeros(slots, bool)  # ticking: started, input not ended
        self._freed = np.zeros(slots, np.int64)  # samples dropped since the last output (re-granted with it)
        self._underflows = np.zeros(slots, np.int64)
        self._owed = np.zeros(slots, np.int64)  # grid ticks skipped while live: their audio goes at the next
        self._slots: list[_Session] = []
        self._by_id: dict[str, _Session] = {}
        self._next_tick: float | None = None
        self._awaiting: set[str] = set()  # sent a user frame this tick, no agent frame since
        self._gather_since: float | None = None  # when the oldest undecoded agent frame arrived
        self._working: list[_Session] = []  # the sessions of the encode/decode call under way (recover)
        self._partial: list[DuplexOutput] = []
        self.ticks = 0
        self.bursts = 0
        self.skipped_ticks = 0
        self.unheard_frames = 0  # user frames those skipped ticks dropped, over all sessions
        metrics.SLOTS_TOTAL.labels(stage="codec").set(config.max_sessions)

    # -- commands ----------------------------------------------------------------------------------------
    def join(self, sid: str) -> int:
        """Admit a session (not ticking until ``start``); returns its slot."""
        if sid in self._by_id:
            raise ValueError(f"session {sid!r} is already open")
        if len(self._slots) >= self.cfg.max_sessions:
            raise DuplexAdmissionError(f"all {self.cfg.max_sessions} codec session slots are held")
        session = _Session(sid, len(self._slots))
        # A fill, not a copy of a host list: that would wait for the tick in flight on the device.
        self.codec.reset(torch.full((1,), session.slot, dtype=torch.int64, device=self.device), "both")
        self.ring.reset(session.slot)
        self._live[session.slot] = False
        self._freed[session.slot] = self._underflows[session.slot] = self._owed[session.slot] = 0
        self._slots.append(session)
        self._by_id[sid] = session
        self._gauges()
        return session.slot

    def start(self, sid: str) -> None:
        """The session ticks from the next tick on (the first live session starts the clock)."""
        s = self._get(sid)
        if s.input_ended:
            raise ValueError(f"session {sid!r} already ended its input")
        self._live[s.slot] = True
        if self._next_tick is None:
            self._next_tick = self.clock() + self.cfg.tick_s

    def end_input(self, sid: str) -> None:
        """No more user frames for this session (its agent frames still decode until it leaves)."""
        s = self._get(sid)
        s.input_ended = True
        self._live[s.slot] = False
        self.ring.clear(s.slot)
        self._awaiting.discard(sid)
        self._stop_clock_if_idle()

    def leave(self, sid: str) -> bool:
        """Free the session's slot now; the last session moves into the hole."""
        s = self._by_id.pop(sid, None)
        if s is None:
            return False
        hole, last = s.slot, len(self._slots) - 1
        if hole != last:
            mover = self._slots[last]
            move_session_state(self.codec, last, hole)
            self.ring.move(last, hole)
            for a in (self._live, self._freed, self._underflows, self._owed):
                a[hole] = a[last]
            mover.slot = hole
            self._slots[hole] = mover
        self._slots.pop()
        self._live[last] = False
        self._awaiting.discard(sid)
        if not any(x.pending for x in self._slots):
            self._gather_since = None
        self._stop_clock_if_idle()
        self._gauges()
        return True

    def push_audio(self, sid: str, pcm: np.ndarray, first_sample: int) -> None:
        """User audio (mono float32 at 24 kHz) continuing the session's stream at ``first_sample``. Beyond the
        jitter buffer's bound the oldest whole frames are dropped (counted), so the newest audio is kept."""
        s = self._get(sid)
        if s.input_ended:
            raise ValueError("user_audio: received after end_of_input")
        pcm = np.asarray(pcm, dtype=np.float32)
        if pcm.ndim != 1:
            raise ValueError(f"user_audio: must be mono, got shape {pcm.shape}")
        end = self.ring.end(s.slot)
        if first_sample != end:
            raise ValueError(f"user_audio.sample_offset: expected {end}, got {first_sample}")
        cap = self.cfg.jitter_samples
        if pcm.size > cap:
            raise ValueError(f"user_audio: {pcm.size} samples exceed the {cap}-sample jitter buffer")
        if not np.isfinite(pcm).all():
            raise ValueError("user_audio: contains NaN or infinite samples")
        drop = self.ring.push(s.slot, pcm)
        if drop:
            self._freed[s.slot] += drop
            s.dropped_samples += drop
            metrics.DUPLEX_JITTER_DROPPED.inc(drop / self.sample_rate)

    def push_agent(self, sid: str, frame: AgentFrame) -> None:
        s = self._get(sid)
        codes = np.asarray(frame.codes)
        if codes.shape != (self.groups,):
            raise ValueError(f"frames.codes: must be one frame of {self.groups} groups, got {codes.shape}")
        # Checked on the host: an out-of-range index on a GPU is a device-side assert that kills the process.
        if int(codes.min()) < 0 or int(codes.max()) >= self.codec.codebook_size:
            raise ValueError(f"frames.codes: must lie in [0, {self.codec.codebook_size})")
        if len(s.pending) >= self.cfg.record_limit:
            raise ValueError(f"frames: more than {self.cfg.record_limit} agent frames wait for decoding")
        if self._gather_since is None:
            self._gather_since = self.clock()
        s.pending.append(frame)
        self._awaiting.discard(sid)

    def submit_reference(self, pcm: np.ndarray) -> concurrent.futures.Future[np.ndarray]:
        """Encode a prepared voice recording (24 kHz, whole frames) between ticks; the future carries its
        codes ``[frames, K]`` (int64)."""
        return self.references.submit(pcm)

    # -- introspection -----------------------------------------------------------------------------------
    def sessions(self) -> int:
        return len(self._slots)

    def session_ids(self) -> list[str]:
        return list(self._by_id)

    def info(self, sid: str) -> SessionInfo:
        s = self._get(sid)
        i = s.slot
        live, fill, under = bool(self._live[i]), int(self.ring.fill[i]), int(self._underflows[i])
        return SessionInfo(i, live, fill, under, s.late, s.dropped_samples)

    def has_work(self) -> bool:
        now = self.clock()
        return self._tick_due(now) or self._burst_due(now) or self._reference_due(now)

    def idle_timeout(self) -> float | None:
        """Seconds until a tick or a decode burst is due with nothing new arriving."""
        now = self.clock()
        due = [t for t in (self._next_tick, self._gather_deadline()) if t is not None]
        return max(0.0, min(due) - now) if due else None

    # -- the loop ----------------------------------------------------------------------------------------
    def step(self) -> list[DuplexOutput]:
        outputs: list[DuplexOutput] = []
        self._partial = outputs  # what a failing step already produced: recover hands it out
        if self._burst_due(self.clock()):
            outputs += self._burst()
        now = self.clock()
        if self._tick_due(now):
            outputs += self._tick()
        elif self._reference_due(now):
            self.references.step()
        return outputs

    def _tick_due(self, now: float) -> bool:
        return self._next_tick is not None and now >= self._next_tick

    def _gather_deadline(self) -> float | None:
        return None if self._gather_since is None else self._gather_since + self.cfg.gather_s

    def _burst_due(self, now: float) -> bool:
        if self._gather_since is None:
            return False
        if not self._awaiting or any(len(s.pending) >= self.cfg.max_burst_frames for s in self._slots):
            return True
        return now >= self._gather_since + self.cfg.gather_s

    def _reference_due(self, now: float) -> bool:
        if not self.references.pending():
            return False
        if self._next_tick is None:
            return True  # no session ticks: nobody to stall
        # Between ticks only, and only where the chunk fits before the next tick (as the last one took).
        return self._gather_since is None and self._next_tick - now > self.references.chunk_seconds

    def _tick(self) -> list[DuplexOutput]:
        assert self._next_tick is not None
        start = self._next_tick
        n = len(self._slots)
        b = batch_bucket(n, self.cfg.max_sessions)
        # Every live session's frame of this tick in one gather; silence where its buffer holds none.
        live = self._live[:n]
        if self._owed[:n].any():
            self._drop_unheard(n, live)
        has = live & (self.ring.fill[:n] >= self.spf)
        rows = np.flatnonzero(has)
        pcm = np.zeros((b, self.spf), np.float32)
        source = np.full(n, -1, np.int64)
        pcm[rows], source[rows] = self.ring.take(rows)
        freed = self._freed[:n] + has * self.spf
        self._freed[:n][live] = 0
        short = live & ~has
        self._underflows[:n] += short
        if short.any():
            metrics.DUPLEX_INPUT_UNDERFLOW.inc(int(short.sum()))
        lengths = np.zeros(b, np.int64)
        lengths[:n] = live
        taken = [(s, int(source[s.slot]), int(freed[s.slot])) for s in self._slots if live[s.slot]]
        self._working = [s for s, _, _ in taken]
        t0 = time.perf_counter()
        codes = self.calls.encode(
            torch.from_numpy(pcm).to(self.device), torch.from_numpy(lengths).to(self.device)
        )
        codes_np = codes[:b, :, 0].to("cpu", copy=True).numpy()  # graph outputs are reused buffers
        metrics.STAGE_TICK.labels(stage="codec").observe(time.perf_counter() - t0)
        outputs: list[DuplexOutput] = []
        self._awaiting = set()
        for s, source, freed in taken:
            s.records.append((s.sent, source, start))
            if len(s.records) > self.cfg.record_limit:
                s.records.popleft()
            outputs.append(UserCodes(s.sid, s.sent, codes_np[s.slot].copy(), source, freed))
            s.sent += 1
            self._awaiting.add(s.sid)
        self.ticks += 1
        # The next tick stays on the grid; ticks the engine fell more than one behind on are skipped.
        nxt, now = start + self.cfg.tick_s, self.clock()
        while nxt <= now:
            nxt += self.cfg.tick_s
            self.skipped_ticks += 1
            self._owed[:n] += live  # the sessions live then (a session that joins later owes nothing)
            metrics.DUPLEX_SKIPPED_TICKS.inc()
        self._next_tick = nxt
        return outputs

    def _drop_unheard(self, n: int, live: np.ndarray) -> None:
        """The audio of the grid ticks the engine was too late for leaves unheard, oldest first, up to the
        frames a session holds beyond this tick's one. Kept, it would sit in the jitter buffer, since each
        tick takes one frame, and every answer would stay that many ticks late for the rest of the session."""
        held = self.ring.fill[:n] // self.spf
        frames = np.minimum(self._owed[:n], np.maximum(held - 1, 0)) * live
        self._owed[:n] = 0
        rows = np.flatnonzero(frames)
        if not rows.size:
            return
        samples = frames[rows] * self.spf
        self.unheard_frames += int(frames[rows].sum())
        self.ring.drop(rows, samples)
        self._freed[rows] += samples  # re-granted to the gateway with the next user codes
        for s in self._slots:  # rare (a stall), so per session here is fine
            s.dropped_samples += int(frames[s.slot]) * self.spf
        metrics.DUPLEX_JITTER_DROPPED.inc(float(samples.sum()) / self.sample_rate)

    def _burst(self) -> list[DuplexOutput]:
        b = batch_bucket(len(self._slots), self.cfg.max_sessions)
        t = min(max(len(s.pending) for s in self._slots), self.cfg.max_burst_frames)
        codes = np.zeros((b, self.groups, t), np.int64)
        lengths = np.zeros(b, np.int64)
        taken: list[tuple[_Session, list[AgentFrame]]] = []
        for s in self._slots:
            frames = [s.pending.popleft() for _ in range(min(len(s.pending), t))]
            for j, f in enumerate(frames):
                codes[s.slot, :, j] = f.codes
            lengths[s.slot] = len(frames)
            if frames:
                taken.append((s, frames))
        self._working = [s for s, _ in taken]
        t0 = time.perf_counter()
        wav = self.calls.decode(
            torch.from_numpy(codes).to(self.device), torch.from_numpy(lengths).to(self.device)
        )
        wav_np = wav[:b].float().to("cpu", copy=True).numpy()
        metrics.STAGE_TICK.labels(stage="codec").observe(time.perf_counter() - t0)
        done = self.clock()
        outputs: list[DuplexOutput] = []
        for s, frames in taken:
            for j, f in enumerate(frames):
                source, deadline = self._map_user_frame(s, f.user_frame)
                late = deadline is not None and done > deadline
                if late:
                    s.late += 1
                    metrics.DUPLEX_LATE_FRAMES.inc()
                pcm = wav_np[s.slot, j * self.spf : (j + 1) * self.spf].copy()
                outputs.append(AgentAudio(s.sid, f.index, pcm, f.text_token, f.transcript, source, late))
        self._gather_since = done if any(s.pending for s in self._slots) else None
        self.bursts += 1
        return outputs

    def recover(self, exc: Exception) -> tuple[list[str], list[DuplexOutput]]:
        """``step`` raised ``exc`` (not a device failure): the sessions of the failed call (all when
        unknown) leave; returns their ids and what the step had produced for the others."""
        failed, self._working = self._working or list(self._slots), []
        ids = [s.sid for s in failed if self._by_id.get(s.sid) is s]
        for sid in ids:
            log.error("codec: duplex session %s ended: %s", sid, one_line(exc))
            self.leave(sid)
        return ids, [o for o in self._partial if o.session_id not in ids]

    def _map_user_frame(self, s: _Session, user_frame: int) -> tuple[int, float | None]:
        """The gateway frame (or -1) behind talker user frame ``user_frame``, and its PCM deadline."""
        if user_frame < 0:
            return -1, None  # the prompt's own step: tied to no tick
        while s.records and s.records[0][0] < user_frame:
            s.records.popleft()  # skipped by the talker (its backlog drops) or answered already
        if s.records and s.records[0][0] == user_frame:
            _, source, start = s.records.popleft()
            return source, start + self.cfg.tick_s
        return -1, None

    # -- warm-up -------------------------------------------------------------------------------------------
    def warm_up(self) -> float:
        """One synthetic tick and decode on the real path (slot 0, then freed), a short voice recording, and
        every CUDA graph captured when the calls are graphed; returns the seconds it took."""
        if self._slots:
            raise RuntimeError("warm-up needs an idle engine")
        t0 = time.perf_counter()
        sid = "__warmup__"
        self.join(sid)
        rng = np.random.default_rng(0)
        self.push_audio(sid, (0.1 * rng.standard_normal(self.spf)).astype(np.float32), 0)
        self._live[self._by_id[sid].slot] = True
        self._next_tick = self.clock()
        (user,) = [o for o in self._tick() if isinstance(o, UserCodes)]
        self.push_agent(sid, AgentFrame(0, user.codes, 0, "", 0))
        self._burst()
        self.leave(sid)
        self._next_tick, self.ticks, self.bursts, self.skipped_ticks, self.unheard_frames = None, 0, 0, 0, 0
        self._owed[:] = 0
        future = self.submit_reference(np.zeros(2 * self.spf, np.float32))
        while self.references.pending():
            self.references.step()
        future.result()
        log_capture(log, "codec", self.calls.capture_all, what="duplex CUDA graphs")
        return time.perf_counter() - t0

    # -- internals -------------------------------------------------------------------------------------
    def _stop_clock_if_idle(self) -> None:
        if not self._live[: len(self._slots)].any():
            self._next_tick = None
            self._owed[:] = 0

    def _get(self, sid: str) -> _Session:
        try:
            return self._by_id[sid]
        except KeyError:
            raise KeyError(f"no open duplex codec session {sid!r}") from None

    def _gauges(self) -> None:
        metrics.ACTIVE_STREAMS.labels(stage="codec").set(len(self._slots))
        metrics.SLOTS_IN_USE.labels(stage="codec").set(len(self._slots))
