"""Talker engine: fixed slots, continuous batching, chunked prefill and one frame step per tick.

Model-agnostic; a family plugs in through ``TalkerAdapter`` (``adapter.py``). The engine is owned by one
thread (``voxstage.stage.engine_loop``) and never touches gRPC.

Slots are kept **packed**: slots ``[0, n_used)`` are in use, so a tick's decode runs over a contiguous
prefix of the KV pool (views, no gathers) and one CUDA graph per (batch bucket, context bucket) covers
it. Rows of the bucket that must not advance this tick (still prefilling, starved of streamed text, or
padding) run masked: their outputs are dropped and their state is left as it was. When a request leaves,
the last used slot moves into the hole.

Per tick: apply admissions (a request that cannot fit ``max_model_len`` is rejected at submit, never
truncated), spend the ``max_num_batched_tokens`` budget on prefill chunks (oldest first), then one frame
step for every slot in decode. A prompt's last position is the slot's first decode input; an adapter
that keeps the prefill's hidden state (``prefills_last_position``) prefills it too when a prefill runs
anyway, and the first frame step then needs no backbone pass for that row. Under load the frame steps may
be paced (``EngineConfig.pacing``, services/talker/pacing.py): spaced, and far-ahead streams held.

A failure belongs to its request: before each call into the adapter the engine notes which requests that
call works on (``_working``); when a tick raises, ``recover`` ends exactly those (``Finish.ERROR``, slot
freed) and the engine goes on. A batched prefill that fails is retried one request at a time first, so one
bad prompt does not take the others of its tick down with it.
"""

from __future__ import annotations

import enum
import logging
import time
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from services.talker.adapter import PreparedPrompt, TalkerAdapter
from services.talker.engine_types import (  # noqa: F401 - the engine's public types, importable from here
    AdmissionError,
    EngineConfig,
    Finish,
    RequestTooLarge,
    TalkerOutput,
    TalkerRequest,
)
from voxstage import metrics
from voxstage.stage.engine_loop import Steppable
from voxstage.stage.faults import each_alone_on_failure, one_line

log = logging.getLogger(__name__)


class _Phase(enum.Enum):
    PREFILL = 1
    DECODE = 2


@dataclass
class _Seq:
    request: TalkerRequest
    prepared: PreparedPrompt
    slot: int = -1
    phase: _Phase = _Phase.PREFILL
    prefilled: int = 0  # prompt positions already in the KV cache
    prefill_last: bool = False  # the prefill takes the last position too (``prefills_last_position``)
    frames: int = 0  # frames delivered
    launched: int = 0  # frame steps launched (frames + those in flight)
    done: bool = False
    text_queued: int = 0  # trailing text tokens handed to the adapter
    submitted_at: float = field(default_factory=time.perf_counter)
    first_frame_at: float | None = None  # when its first frame was collected (pacing's real-time clock)

    @property
    def prefill_target(self) -> int:
        # The last position is the first decode input; an adapter that keeps the prefill's hidden state
        # takes it in the prefill instead, when there is one to run (its first step then skips the backbone).
        return self.prepared.length - (0 if self.prefill_last else 1)

    @property
    def position(self) -> int:
        """Absolute position of the next decode input (counting steps still in flight)."""
        return self.prepared.length - 1 + self.launched

    @property
    def kv_len(self) -> int:
        """Positions of this sequence already in the KV cache."""
        return self.prefilled if self.phase is _Phase.PREFILL else self.position


class TalkerEngine(Steppable[TalkerOutput]):
    def __init__(self, adapter: TalkerAdapter, config: EngineConfig) -> None:
        self.adapter = adapter
        self.cfg = config
        adapter.allocate(config.max_num_seqs, config.max_model_len)
        adapter.set_prefix_cache(config.prefix_cache_bytes)
        self._waiting: deque[_Seq] = deque()
        self._slots: list[_Seq] = []  # index == slot, packed
        self._by_id: dict[str, _Seq] = {}
        self._cancelled: list[_Seq] = []
        # Segments of one stream (services/talker/stream.py): the next take waits here, keyed by the take it
        # follows, and claims the first free slot the moment that take ends, ahead of the queue.
        self._followers: dict[str, _Seq] = {}
        self._inflight: tuple[object, list[_Seq | None]] | None = None
        self._working: list[_Seq] = []  # the requests the adapter call under way works on (see recover)
        self._partial: list[TalkerOutput] = []
        self._last_launch = -1e9  # perf_counter of the last frame step launched (pacing)
        self.prefix_hits = 0
        self.prefill_tokens_saved = 0
        self.ticks = 0
        metrics.SLOTS_TOTAL.labels(stage="talker").set(config.max_num_seqs)

    # -- commands (engine thread) ------------------------------------------------------------------
    def submit(self, request: TalkerRequest, follows: str | None = None) -> None:
        """Queue ``request``; with ``follows``, it starts only once that request ends, before anything
        else waiting (a stream's next segment keeps the stream's place instead of queueing behind others)."""
        if request.request_id in self._by_id:
            raise ValueError(f"request {request.request_id!r} is already running")
        if request.max_frames < 1:
            raise ValueError(f"max_frames must be >= 1, got {request.max_frames}")
        # Validate before admission control: a bad request is the caller's error whatever the load.
        prepared = self.adapter.prepare(request.spec)
        seq = _Seq(request, prepared)
        self._check_fits(seq)
        if len(self._waiting) >= self.cfg.max_queue:
            raise AdmissionError(f"talker queue is full ({self.cfg.max_queue} waiting)")
        self._by_id[request.request_id] = seq
        if follows is not None and follows in self._by_id:
            if follows in self._followers:
                raise ValueError(f"request {follows!r} already has a follower")
            self._followers[follows] = seq
        elif follows is not None:
            self._waiting.appendleft(seq)  # the take it follows has already ended
        else:
            self._waiting.append(seq)
        self._update_gauges()

    def push_text(self, request_id: str, text: str, complete: bool, max_frames: int | None = None) -> None:
        """Append streamed text; ``max_frames`` replaces the frame budget (it grows with the text)."""
        seq = self._get(request_id)
        if seq.prepared.text_complete:
            raise ValueError(f"request {request_id!r}: text input is already complete")
        seq.prepared.extend_text(text, complete)
        if max_frames is not None:
            seq.request.max_frames = max(max_frames, 1)
        try:
            self._check_fits(seq)
        except RequestTooLarge:
            # The request ends alone: a running one is freed at the next tick, a waiting one at once.
            if seq.slot >= 0:
                self._cancelled.append(seq)
            else:
                self._by_id.pop(request_id, None)
                self._unqueue(seq)
            raise
        if seq.slot >= 0:
            self._feed_text(seq)

    def cancel(self, request_id: str) -> bool:
        seq = self._by_id.get(request_id)
        if seq is None:
            return False
        self._cancelled.append(seq)
        return True

    # -- introspection ---------------------------------------------------------------------------------
    def has_work(self) -> bool:
        admissible = len(self._slots) < self.cfg.max_num_seqs and any(s.prepared.ready for s in self._waiting)
        if self.cfg.pacing.on:
            prefilling = any(s.phase is _Phase.PREFILL for s in self._slots)
            runnable = prefilling or self._decode_wait() == 0.0
        else:
            runnable = any(self._runnable(s) for s in self._slots)
        return bool(admissible or self._cancelled or runnable or self._inflight)

    def idle_timeout(self) -> float | None:
        """While paced frame steps wait for their time (``EngineConfig.pacing``), that wait: the engine thread
        sleeps on its command queue until then instead of spinning."""
        wait = self._decode_wait() if self.cfg.pacing.on else None
        return wait or None

    def _hold_left(self, seq: _Seq, slots: int, now: float) -> float:
        if seq.request.whole_clip:
            return 0.0
        return self.cfg.pacing.hold_left(slots, seq.first_frame_at, seq.launched, now)

    def _decode_wait(self) -> float | None:
        """Seconds until a frame step may launch under pacing (0: now); None when no slot could step."""
        n, now = len(self._slots), time.perf_counter()
        least: float | None = None
        for seq in self._slots:
            if self._launchable(seq):
                hold = self._hold_left(seq, n, now)
                least = hold if least is None else min(least, hold)
                if least == 0.0:
                    break  # a slot may step now: no need to look at the others
        return None if least is None else max(least, self.cfg.pacing.step_wait(n, self._last_launch, now))

    def slots_in_use(self) -> int:
        return len(self._slots)

    def queue_depth(self) -> int:
        return len(self._waiting) + len(self._followers)

    def slot_of(self, request_id: str) -> int:
        """The slot a running request occupies (-1: waiting or absent); slots move when others leave."""
        seq = self._by_id.get(request_id)
        return -1 if seq is None else seq.slot

    def request_state(self, request_id: str) -> str:
        seq = self._by_id.get(request_id)
        if seq is None:
            return "absent"
        if seq.slot < 0:
            return "waiting"
        return "prefill" if seq.phase is _Phase.PREFILL else "decode"

    # -- the tick ----------------------------------------------------------------------------------------
    def step(self) -> list[TalkerOutput]:
        t0 = time.perf_counter()
        outputs: list[TalkerOutput] = []
        self._partial = outputs  # what a failing tick already produced: recover hands it out
        for seq in self._cancelled:
            if self._by_id.get(seq.request.request_id) is seq:
                outputs.append(self._finish(seq, Finish.CANCELLED))
        self._cancelled.clear()
        self._admit()
        self._prefill()
        outputs += self._decode()
        self.ticks += 1
        self._update_gauges()
        metrics.STAGE_TICK.labels(stage="talker").observe(time.perf_counter() - t0)
        return outputs

    def _check_fits(self, seq: _Seq) -> None:
        # max_frames is a bound, not an expected length: a request is rejected only if its prompt cannot
        # fit with room for min_frames; otherwise it stops at max_model_len with that finish reason.
        p = seq.prepared
        if p.ready and p.length + seq.request.min_frames > self.cfg.max_model_len:
            raise RequestTooLarge(
                f"prompt is {p.length} positions; with min_frames {seq.request.min_frames} it "
                f"exceeds max_model_len {self.cfg.max_model_len}"
            )
        # Each frame consumes one trailing text token, so text past max_model_len could never be spoken
        # (and a slot's text queue is sized for that bound: more would not fit it).
        trailing = len(p.trailing_ids)
        if p.ready and p.length - 1 + trailing > self.cfg.max_model_len:
            raise RequestTooLarge(
                f"text: {trailing} tokens still to speak after a prompt of {p.length} positions exceed "
                f"max_model_len {self.cfg.max_model_len}"
            )

    def _admit(self) -> None:
        admitted: list[_Seq] = []
        # The adapter may make the tick's admission writes together as this closes (``batched_writes``).
        with self.adapter.batched_writes():
            while len(self._slots) < self.cfg.max_num_seqs:
                # FIFO among requests whose prompt is buildable (streamed text may still be too short).
                seq = next((s for s in self._waiting if s.prepared.ready), None)
                if seq is None:
                    break
                self._waiting.remove(seq)
                seq.slot = len(self._slots)
                self._slots.append(seq)
                self._working = [seq]
                r = seq.request
                self.adapter.admit(
                    seq.slot,
                    seq.prepared,
                    seed=r.seed,
                    sampling=r.sampling,
                    subtalker=r.subtalker,
                    min_frames=r.min_frames,
                )
                seq.text_queued = 0
                self._feed_text(seq)
                admitted.append(seq)
            self._working = admitted  # the writes these admissions made, as the context closes
        for seq in admitted:
            self._working = [seq]
            if self.cfg.enable_prefix_caching:
                reused = self.adapter.reuse_prefix(seq.slot, seq.prepared, seq.prefill_target)
                if reused:
                    seq.prefilled = reused
                    self.prefix_hits += 1
                    self.prefill_tokens_saved += reused
                    metrics.PREFILL_TOKENS.labels(source="prefix_cache").inc(reused)
            # Decided once the prefix is in: a prompt the cache covers but for its last position has no
            # prefill to fold that position into, and starts from a whole frame step as before.
            seq.prefill_last = self.adapter.prefills_last_position and seq.prefilled < seq.prefill_target
        self._working = []

    def _prefill(self) -> None:
        budget = self.cfg.max_num_batched_tokens
        planned: list[tuple[_Seq, int]] = []  # (sequence, tokens to prefill now; 0: prefix cache had all)
        for seq in self._slots:
            if budget <= 0:
                break
            if seq.phase is not _Phase.PREFILL:
                continue
            n = max(0, min(seq.prefill_target - seq.prefilled, budget))
            planned.append((seq, n))
            budget -= n
        chunks = [(seq.slot, seq.prepared, seq.prefilled, n) for seq, n in planned if n]
        with self.adapter.batched_writes():  # the slots' parking and first positions, written together
            if chunks:
                # One call for the whole tick: the adapter batches short chunks into one forward, so a
                # burst of arrivals delays the running streams' next frame by about one prefill, not one
                # per arrival.
                self._prefill_chunks([seq for seq, n in planned if n], chunks)
            for seq, n in planned:
                self._working = [seq]
                if n:
                    seq.prefilled += n
                    metrics.PREFILL_TOKENS.labels(source="computed").inc(n)
                if seq.prefilled >= seq.prefill_target:
                    if self.cfg.enable_prefix_caching:
                        self.adapter.store_prefix(seq.slot, seq.prepared)
                    self.adapter.start_decode(seq.slot, seq.prepared)
                    seq.phase = _Phase.DECODE
            self._working = [seq for seq, _ in planned]
        self._working = []

    def _prefill_chunks(self, seqs: list[_Seq], chunks: list[tuple[int, PreparedPrompt, int, int]]) -> None:
        # Prefill only writes its own positions, so after a batched failure each chunk is redone alone: the
        # one that fails again is the one to end (recover); the others keep their place.
        each_alone_on_failure(self.adapter.prefill_many, chunks, seqs, self._set_working)

    def _set_working(self, seqs: list[_Seq]) -> None:
        self._working = seqs

    def _runnable(self, seq: _Seq) -> bool:
        if seq.phase is _Phase.PREFILL:
            return True
        # Streamed text: frame t consumes trailing text token t, so it may only run once that token (or
        # the end of text) has arrived; otherwise the slot waits rather than speaking `pad` too early.
        return seq.prepared.text_complete or seq.launched < seq.text_queued

    def _launchable(self, seq: _Seq) -> bool:
        return (
            seq.phase is _Phase.DECODE
            and self._runnable(seq)
            and seq.launched < seq.request.max_frames
            and seq.position + 1 <= self.cfg.max_model_len
        )

    def _decode(self) -> list[TalkerOutput]:
        if self.cfg.pacing.step_wait(len(self._slots), self._last_launch, time.perf_counter()) > 0.0:
            # Too soon under load: collect the step in flight (its frames are due) and launch none, so the
            # device is free for the other stage until the pace allows the next step.
            if any(self._launchable(s) for s in self._slots):
                metrics.TALKER_PACED.labels(by="interval").inc()
            previous, self._inflight = self._inflight, None
            return self._collect(previous) if previous else []
        launched = self._launch()
        if not self.cfg.async_scheduling:
            return self._collect(launched) if launched else []
        previous, self._inflight = self._inflight, launched
        return self._collect(previous) if previous else []

    def _launch(self) -> tuple[object, list[_Seq | None]] | None:
        active = [self._launchable(s) for s in self._slots]
        if self.cfg.pacing.ahead_s > 0.0:  # streams far ahead of real time sit this step out (pacing.py)
            n, now = len(self._slots), time.perf_counter()
            pacing = self.cfg.pacing
            held = [
                a and not pacing.rides(self._hold_left(s, n, now))
                for s, a in zip(self._slots, active, strict=True)
            ]
            if any(held):
                metrics.TALKER_PACED.labels(by="ahead").inc(sum(held))
                active = [a and not h for a, h in zip(active, held, strict=True)]
        starved = sum(1 for s in self._slots if s.phase is _Phase.DECODE and not self._runnable(s))
        if starved:
            metrics.INPUT_STARVED.inc(starved)
        if not any(active):
            return None
        n = max(i for i, a in enumerate(active) if a) + 1
        rows = [s if a else None for s, a in zip(self._slots[:n], active[:n], strict=True)]
        self._working = [s for s in rows if s is not None]
        max_pos = max(s.position for s in rows if s is not None)
        handle = self.adapter.launch(active[:n], max_pos + 1)
        self._last_launch = time.perf_counter()
        for seq in rows:
            if seq is not None:
                seq.launched += 1
        return handle, rows

    def _collect(self, launched: tuple[object, list[_Seq | None]]) -> list[TalkerOutput]:
        handle, rows = launched
        self._working = [s for s in rows if s is not None]
        codes, eos = self.adapter.collect(handle)
        outputs = []
        finished: list[tuple[_Seq, Finish, str | None]] = []
        limit = self.adapter.codebook_size
        # Every row's checks in two array ops, not two reductions per row (inactive rows' junk included).
        n = len(rows)
        ended = np.asarray(eos[:n], dtype=bool).tolist()
        out_of_range = ((codes[:n].min(axis=1) < 0) | (codes[:n].max(axis=1) >= limit)).tolist()
        for i, seq in enumerate(rows):
            if seq is None or seq.done:
                continue  # inactive row, or a request that ended while this step was in flight
            if ended[i]:
                finished.append((seq, Finish.EOS, None))
                continue
            if out_of_range[i]:
                # Never forwarded: a codec would reject the whole stream anyway. An engine bug, so say where.
                why = f"frame {seq.frames} has codes outside [0, {limit}): {codes[i].tolist()}"
                log.error("request %s (slot %d, row %d): %s", seq.request.request_id, seq.slot, i, why)
                finished.append((seq, Finish.ERROR, why))
                continue
            seq.frames += 1
            if seq.first_frame_at is None:
                seq.first_frame_at = time.perf_counter()  # the real-time clock a held stream is paced by
            outputs.append(TalkerOutput(seq.request.request_id, codes[i : i + 1], seq.frames - 1))
            if seq.frames >= seq.request.max_frames:
                finished.append((seq, Finish.MAX_FRAMES, None))
            elif seq.prepared.length + seq.frames > self.cfg.max_model_len:
                finished.append((seq, Finish.MAX_MODEL_LEN, None))
        outputs += [self._finish(seq, why, error) for seq, why, error in finished]
        self._working = []
        return outputs

    def recover(self, exc: Exception) -> tuple[list[str], list[TalkerOutput]]:
        """``step`` raised ``exc`` (not a device failure): end the requests the failed call worked on (all
        in slots when it is unknown) and free their slots. Returns their ids, and the outputs the tick had
        produced for the others before it failed. A step left in flight is abandoned with its rows."""
        failed = [s for s in self._working if not s.done] or list(self._slots)
        if self._inflight is not None:  # its step may have advanced their state: they end too
            failed += [s for s in self._inflight[1] if s is not None and s not in failed]
        self._working = []
        self._inflight = None
        ids = []
        # Last slot first: each hole is then the last used slot, so no other request's KV moves.
        for seq in sorted(failed, key=lambda s: -s.slot):
            if self._by_id.get(seq.request.request_id) is seq:
                log.error("talker: request %s ended: %s", seq.request.request_id, one_line(exc))
                self._finish(seq, Finish.ERROR, one_line(exc))
                ids.append(seq.request.request_id)
        self._update_gauges()
        return ids, [o for o in self._partial if o.request_id not in ids]

    # -- slot bookkeeping ----------------------------------------------------------------------------
    def _feed_text(self, seq: _Seq) -> None:
        ids = seq.prepared.trailing_ids[seq.text_queued :]
        self.adapter.append_text(seq.slot, seq.text_queued, ids, seq.prepared.text_complete)
        seq.text_queued += len(ids)

    def _finish(self, seq: _Seq, why: Finish, error: str | None = None) -> TalkerOutput:
        rid = seq.request.request_id
        seq.done = True
        self._by_id.pop(rid, None)
        follower = self._followers.pop(rid, None)
        if follower is not None:
            if why in (Finish.CANCELLED, Finish.ERROR):
                self._cancelled.append(follower)  # the stream is ending: its queued segment goes too
            else:
                self._waiting.appendleft(follower)
        if seq.slot < 0:
            self._unqueue(seq)
        else:
            hole, last = seq.slot, len(self._slots) - 1
            if hole != last:
                mover = self._slots[last]
                self.adapter.move_slot(last, hole, mover.kv_len)
                mover.slot = hole
                self._slots[hole] = mover
            self._slots.pop()
            seq.slot = -1
        metrics.STAGE_REQUESTS.labels(stage="talker", finish=why.value).inc()
        return TalkerOutput(rid, np.zeros((0, self.adapter.num_groups), np.int64), seq.frames, why, error)

    def _unqueue(self, seq: _Seq) -> None:
        if seq in self._waiting:
            self._waiting.remove(seq)
            return
        for key, follower in list(self._followers.items()):
            if follower is seq:
                del self._followers[key]

    def _get(self, request_id: str) -> _Seq:
        try:
            return self._by_id[request_id]
        except KeyError:
            raise KeyError(f"no running talker request {request_id!r}") from None

    def _update_gauges(self) -> None:
        metrics.SLOTS_IN_USE.labels(stage="talker").set(len(self._slots))
        metrics.ACTIVE_STREAMS.labels(stage="talker").set(len(self._slots))
        metrics.QUEUE_DEPTH.labels(stage="talker").set(self.queue_depth())
