"""Codec engine: per-stream streaming state, a chunk schedule, and batched decodes each tick.

Model-agnostic: it drives any ``StreamingCodec`` (a slot pool whose ``decode(codes [B,Q,T], slots [B],
lengths [B])`` advances only the named slots). A tick groups the streams' ready chunks into decode calls
(``services.codec.schedule``: ``fifo``, every ready chunk, one call per frame bucket; ``deadline``, chunks by
when each stream's player runs dry within a bounded tick), rows right-padded to the call's bucket with
``lengths`` keeping padding out of every stream's state. What docs/architecture.md ("Codec engine", "The
codec tick schedule") sets out and this module implements:

* the chunk schedule (``voxstage.chunking``): a first chunk, a ramp, steady chunks, the remainder at the end;
  the first and ramp chunks decode one per tick, so their PCM does not depend on when their frames came;
* segments (``end_segment``): decodes never cross a take's mark and the schedule restarts after it, while
  the decoder state runs on (no re-warm at the seam);
* async scheduling: ``step`` collects what the previous step launched and launches this tick's without
  waiting (audio one ``step`` later, the same PCM); every call of a tick launches before any is read back,
  smallest bucket first, and with ``early_handout`` (``fifo``) audio in hand goes out without waiting for a
  bulk decode still running;
* a voice-clone prefix decoded alone with its audio dropped, or, for a voice-library voice, the slot state
  its first stream reached restored instead (``voice_states``: the same state, so the same PCM);
* overlap+crop (``left_context > 0``): each chunk decoded from a reset slot behind earlier frames whose audio
  is cropped, kept as a documented, approximate alternative (docs/models.md).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Protocol, cast

import numpy as np
import torch

from services.codec.calls import Bucket, DecodeCalls, DecodeFn
from services.codec.decode_cost import DecodeCost, measure, time_call
from services.codec.engine_state import ChunkSchedule, Launched, StreamState, count_rows, read_back
from services.codec.schedule import (
    FIRST_CHUNKS,
    TICK_POLICIES,
    Call,
    FirstChunks,
    Row,
    TickPolicy,
    batch_bucket,
    deadline_calls,
    fifo_calls,
)
from services.codec.voice_states import DecoderSnapshot, VoiceStateCache
from voxstage import metrics
from voxstage.chunking import chunk_sizes
from voxstage.host_copy import to_device
from voxstage.stage.engine_loop import Steppable
from voxstage.stage.faults import one_line

log = logging.getLogger(__name__)


class CodecAdmissionError(RuntimeError):
    """No stream slot is free (maps to RESOURCE_EXHAUSTED)."""


class StreamingCodec(Protocol):
    max_streams: int
    samples_per_frame: int

    def decode(
        self, codes: torch.Tensor, slots: torch.Tensor, lengths: torch.Tensor | None = None
    ) -> torch.Tensor: ...

    def reset(self, slots: torch.Tensor) -> None: ...


class SnapshotCodec(StreamingCodec, Protocol):
    """A ``StreamingCodec`` whose slot state can be copied out and put back (``voice_states``)."""

    def snapshot(self, slot: int) -> DecoderSnapshot: ...

    def restore(self, slot: int, state: Any) -> None: ...


@dataclass
class CodecOutput:
    stream_id: str
    pcm: np.ndarray  # float32 mono at the codec's native rate
    sample_offset: int
    final: bool
    frames: int
    segment_end: bool = False  # this output holds the last frames before an ``end_segment`` mark


class CodecEngine(Steppable[CodecOutput]):
    """Owned by one thread (see ``voxstage.stage.engine_loop``); call methods only from it."""

    def __init__(
        self,
        codec: StreamingCodec,
        *,
        max_streams: int,
        schedule: ChunkSchedule,
        num_groups: int,
        device: torch.device | str = "cpu",
        decode_fn: DecodeFn | None = None,
        frame_buckets: tuple[int, ...] = (),
        sample_rate: int = 24000,
        codebook_size: int = 2048,
        left_context: int = 0,
        async_scheduling: bool = False,
        tick_policy: TickPolicy = "fifo",
        tick_budget_s: float = 0.02,
        first_chunks: FirstChunks = "lead",
        max_wait_s: float = 1.5,
        cost: DecodeCost | None = None,
        voice_states: VoiceStateCache | None = None,
    ) -> None:
        # Padding rows of a batch bucket need distinct slots of their own: the pool holds 2x max_streams and
        # the upper half is scratch.
        if codec.max_streams < 2 * max_streams:
            raise ValueError(f"codec pool has {codec.max_streams} slots; engine needs {2 * max_streams}")
        self.codec = codec
        self.max_streams = max_streams
        self.schedule = schedule
        self.num_groups = num_groups
        self.device = torch.device(device)
        self.spf = codec.samples_per_frame
        self.sample_rate = sample_rate
        self.codebook_size = codebook_size
        self.decode_fn = decode_fn  # GraphedDecode on CUDA: the worker captures its graphs at start-up
        eager = decode_fn or codec.decode
        self.calls = decode_fn if isinstance(decode_fn, DecodeCalls) else DecodeCalls(eager)
        self.frame_buckets = tuple(sorted(set(frame_buckets)))
        if left_context < 0:
            raise ValueError(f"left_context must be >= 0, got {left_context}")
        self.left_context = left_context
        self.async_scheduling = async_scheduling
        if tick_policy not in TICK_POLICIES:
            raise ValueError(f"tick_policy must be one of {', '.join(TICK_POLICIES)}, got {tick_policy!r}")
        if tick_budget_s <= 0:
            raise ValueError(f"tick_budget_s must be > 0, got {tick_budget_s}")
        self.tick_policy: TickPolicy = tick_policy
        self.tick_budget_s = tick_budget_s
        if first_chunks not in FIRST_CHUNKS:
            raise ValueError(f"first_chunks must be one of {', '.join(FIRST_CHUNKS)}, got {first_chunks!r}")
        self.first_chunks: FirstChunks = first_chunks
        if max_wait_s <= 0:
            raise ValueError(f"max_wait_s must be > 0, got {max_wait_s}")
        # The deadline policy's bound on how long a ready chunk waits, whatever its player holds: a stream
        # far ahead of its listener must still see progress before its consumer's stall timeout.
        self.max_wait_s = max_wait_s
        self.cost = cost  # the deadline policy's DecodeCost: measured by calibrate() at the worker's warm-up
        self.planned_s = 0.0  # the last tick's estimated device seconds (deadline policy; benchmarks read it)
        self.early_handout = True  # on evidence (docs/architecture.md, "fifo"); codec_schedule.py flips it
        if voice_states is not None and left_context:
            raise ValueError("voice_states needs the stateful decode (left_context 0); overlap+crop has none")
        # Decoder states after a voice-library voice's reference prefix (services/codec/voice_states.py);
        # None: every stream decodes its prefix (a family whose pool cannot snapshot, or the cache off).
        self.voice_states = voice_states
        self._inflight: list[Launched] = []
        self._free = list(range(max_streams - 1, -1, -1))
        self._streams: dict[str, StreamState] = {}
        self._working: list[StreamState] = []  # the streams the decode call under way works on (recover)
        self._partial: list[CodecOutput] = []
        self.ticks = 0
        # With slots_in_use it makes the occupancy ratio the codec's autoscaler targets (deploy/k8s); the
        # talker engine and the duplex codec set theirs the same way.
        metrics.SLOTS_TOTAL.labels(stage="codec").set(max_streams)

    # -- commands -------------------------------------------------------------------------------------
    def open(
        self,
        stream_id: str,
        *,
        initial_frames: int | None = None,
        prefix: np.ndarray | None = None,
        prefix_key: str = "",
    ) -> int:
        """Admit a stream; ``prefix`` codes are decoded first and their audio dropped. ``prefix_key`` names
        the voice they are (``<voice id>@<version>``): with ``voice_states``, a stream opens from the state
        another stream of that key reached after the same prefix, and the first one stores it."""
        if stream_id in self._streams:
            raise ValueError(f"stream {stream_id!r} is already open")
        if not self._free:
            raise CodecAdmissionError(f"all {self.max_streams} codec streams are busy")
        initial = self.schedule.initial_frames if initial_frames is None else initial_frames
        if not 1 <= initial <= self.schedule.steady_frames:
            raise ValueError(
                f"initial_chunk_frames must be in [1, {self.schedule.steady_frames}], got {initial}"
            )
        has_prefix = prefix is not None and prefix.shape[0] > 0
        if has_prefix:
            assert prefix is not None
            self._check_codes(prefix)
        cached = None
        if has_prefix and prefix_key and self.voice_states is not None:
            assert prefix is not None
            cached = self.voice_states.get(prefix_key, prefix)
        slot = self._free.pop()
        if cached is not None:
            self._snapshots().restore(slot, cached)  # where the prefix's decode would leave the slot
        else:
            # A fill, not a copy of a host list: that would wait for the decode in flight (async scheduling).
            self.codec.reset(torch.full((1,), slot, dtype=torch.int64, device=self.device))
        stream = StreamState(stream_id, slot, initial)
        self._streams[stream_id] = stream
        if has_prefix and cached is None:
            assert prefix is not None
            if self.left_context:  # no state to build: the prefix is context for the first chunks
                stream.history = prefix[-self.left_context :].astype(np.int64)
            else:
                stream.add(prefix.astype(np.int64, copy=False), stream.opened_at)
                stream.prefix_frames = prefix.shape[0]
                if prefix_key and self.voice_states is not None:
                    stream.voice = (prefix_key, prefix)  # its state after the prefix goes to voice_states
        self._update_gauges()
        return slot

    def push(self, stream_id: str, codes: np.ndarray) -> None:
        stream = self._get(stream_id)
        if stream.ended:
            raise ValueError(f"stream {stream_id!r} already ended")
        self._check_codes(codes)
        if codes.shape[0]:
            stream.add(codes.astype(np.int64, copy=False), time.perf_counter())
            stream.received += codes.shape[0]

    def end_segment(self, stream_id: str) -> None:
        """The frames pushed so far end a segment: decode them now, whole chunk or not."""
        stream = self._get(stream_id)
        if stream.ended:
            raise ValueError(f"stream {stream_id!r} already ended")
        stream.marks.append(stream.received)

    def finish(self, stream_id: str) -> None:
        self._get(stream_id).ended = True

    def cancel(self, stream_id: str) -> bool:
        stream = self._streams.pop(stream_id, None)
        if stream is None:
            return False
        self._release(stream)
        return True

    # -- introspection ----------------------------------------------------------------------------------
    def has_work(self) -> bool:
        return bool(self._inflight) or any(
            self._ready_frames(s) or s.drained() or s.mark_due() for s in self._streams.values()
        )

    def active(self) -> int:
        return len(self._streams)

    def buffered_frames(self, stream_id: str) -> int:
        return self._get(stream_id).pending_frames

    def stream_ids(self) -> list[str]:
        return list(self._streams)

    # -- the tick -----------------------------------------------------------------------------------------
    def step(self) -> list[CodecOutput]:
        outputs: list[CodecOutput] = []
        self._partial = outputs  # what a failing step already produced: recover hands it out
        t0 = time.perf_counter()
        launched, self._inflight = self._inflight, []
        collecting = bool(launched)
        if self.tick_policy == "fifo":
            # The previous step's decodes first: stream state is then exactly as the synchronous form sees it.
            for i, group in enumerate(launched):
                if self.early_handout and outputs and not group.done():
                    # Hand out what is decoded now: a young stream's first chunk (small buckets launch first)
                    # must not wait for the read-back of a bulk decode behind it; collected next step.
                    self._inflight = launched[i:]
                    break
                self._inflight = launched[i + 1 :]  # should this collect fail, the others are still owed
                self._collect(group, outputs)
            launched = []
        # Streams with a decode still in flight wait for it: their counts are not final yet. A ramp chunk may
        # follow one decode in flight (``_follows``).
        self._settle([s for s in self._streams.values() if not s.in_flight], outputs)
        rows = self._ready_rows(time.perf_counter())
        if not rows and not collecting:
            return outputs
        calls = self._plan(rows)
        # Every call launches before any is read back: call k+1's host staging overlaps call k's decode.
        fresh: list[Launched] = []
        try:
            for call in calls:
                fresh.append(self._launch(call))
        except Exception:
            # The other calls' decodes (and a deadline step's previous tick) are collected next step.
            self._inflight = [*self._inflight, *launched, *fresh]
            raise
        if self.async_scheduling:
            # deadline: the previous tick is collected only now, behind this one's launch, so the device
            # goes from one bounded tick straight into the next (no idle gap while the host prepares it).
            self._inflight += fresh
            for i, group in enumerate(launched):
                self._inflight = [*launched[i + 1 :], *fresh]
                self._collect(group, outputs)
        else:
            for group in fresh:
                self._collect(group, outputs)
        return self._stepped(bool(rows), t0, outputs)

    def _stepped(self, launched: bool, t0: float, outputs: list[CodecOutput]) -> list[CodecOutput]:
        """A step's end: its tick counted (when it launched decodes), its time and its audio observed."""
        if launched:
            self.ticks += 1
        metrics.STAGE_TICK.labels(stage="codec").observe(time.perf_counter() - t0)
        metrics.AUDIO_GENERATED.labels(stage="codec").inc(
            sum(o.frames for o in outputs) * self.spf / self.sample_rate
        )
        return outputs

    def calibrate(self, *, repeats: int = 3, max_total_s: float = 20.0) -> DecodeCost:
        """Measure the device time of the decode calls this engine makes (the deadline policy's cost
        model; ``services.codec.decode_cost``): every (batch bucket, frame bucket) up to every stream due
        with a whole chunk, through the engine's own calls (a graphed call is captured as it is first timed),
        on scratch slots with no real frame, so no stream's state moves. Call it from the engine thread,
        before serving (the warm-up does, and then captures the buckets a tick can call)."""
        rows = [
            batch_bucket(n, self.max_streams) for n in (1 << i for i in range(self.max_streams.bit_length()))
        ]
        rows.append(self.max_streams)
        s = self.schedule
        eager = chunk_sizes(s.initial_frames, s.steady_frames, s.ramp) + [s.max_frames_per_decode]
        frames = self.frame_buckets or tuple(c + self.left_context for c in eager)
        table = measure(
            lambda b, t: time_call(self.calls, self.device, self.num_groups, self.max_streams, b, t, repeats),
            rows,
            frames,
            budget_s=self.tick_budget_s,
            max_frames=self.max_streams * s.steady_frames,
            max_total_s=max_total_s,
        )
        self.cost = DecodeCost(table)
        return self.cost

    def plannable_call(self, rows: int, frames: int) -> bool:
        """Whether a tick can make a decode call of ``rows`` (a batch bucket) x ``frames``: any under fifo;
        under deadline ticks (once calibrated) a single row, or a call the budget holds
        (``schedule.deadline_calls``)."""
        if self.tick_policy == "fifo" or self.cost is None:
            return True
        return rows == 1 or self.cost(rows, frames) <= self.tick_budget_s

    @property
    def needs_cost(self) -> bool:
        """Whether the warm-up measures the decode cost table (``calibrate``): deadline ticks plan with it."""
        return self.tick_policy == "deadline"

    def start_up_calls(self) -> list[tuple[DecodeCalls, Bucket]]:
        """The decode calls whose graphs the warm-up captures, each with the buckets a tick can make."""
        return [(self.calls, self.plannable_call)]

    # -- internals -------------------------------------------------------------------------------------
    def _ready_rows(self, now: float) -> list[Row[StreamState]]:
        """The streams with a chunk to decode now, one row each (one in flight waits for it, but for a ramp
        chunk that may follow it: ``_follows``)."""
        rows = []
        for s in list(self._streams.values()):
            n = self._chunk_now(s)
            if n:
                if s.ready_since is None:
                    s.ready_since = now
                rows.append(Row(s, n, self._context(s), self._deadline(s, now)))
        return rows

    def _chunk_now(self, s: StreamState) -> int:
        """Frames of ``s``'s chunk that may decode now (0: none)."""
        if s.in_flight and not self._follows(s):
            return 0
        n = self._ready_frames(s)
        return n if not s.in_flight or n < self.schedule.steady_frames else 0

    def _in_flight_groups(self) -> list[Launched]:
        return self._inflight

    def _settle(self, idle: list[StreamState], outputs: list[CodecOutput]) -> None:
        """Terminal outputs owed by idle streams with nothing left to decode."""
        # A segment whose frames all went out already (or that had none) still owes its end marker.
        for stream in [s for s in idle if s.mark_due()]:
            stream.pass_mark()
            final = stream.drained()
            outputs.append(
                CodecOutput(stream.stream_id, np.zeros(0, np.float32), stream.sample_offset, final, 0, True)
            )
            if final:
                self._release(self._streams.pop(stream.stream_id))
        # An input that ended exactly on a chunk boundary still owes its consumer a terminal message.
        for stream in [s for s in idle if s.drained() and s.stream_id in self._streams]:
            outputs.append(
                CodecOutput(stream.stream_id, np.zeros(0, np.float32), stream.sample_offset, True, 0)
            )
            self._release(self._streams.pop(stream.stream_id))

    def _follows(self, s: StreamState) -> bool:
        """Whether ``s``, in flight, may take its next ramp chunk now, behind its decode in flight
        (``deadline`` with async scheduling only). That policy launches a tick before it collects the
        previous one, so a stream launched in tick k is still in flight when tick k+1 is planned: its next
        chunk went in tick k+2, two ticks after its first, and a young stream's second chunk is due 80 ms
        after its first audio (on the H200 every underrun of the closed search fell there). The device runs
        a slot's decodes in launch order and each ramp chunk still decodes alone, so the audio is the same.
        Not for a stream whose collect still changes what comes next: a reference prefix (its voice state is
        stored then), a segment mark, the end of input, or overlap+crop's history; steady chunks wait."""
        return (
            self.tick_policy == "deadline"
            and self.async_scheduling
            and s.in_flight == 1
            and not (s.prefix_frames or s.marks or s.ended or s.voice is not None or self.left_context)
        )

    def _plan(self, rows: list[Row[StreamState]]) -> list[Call[StreamState]]:
        if self.tick_policy == "fifo" or not rows or self.cost is None:
            # No cost model yet (the warm-up's own stream decodes before calibrate): nothing to bound with.
            return fifo_calls(rows, self.frame_buckets)
        calls, self.planned_s = deadline_calls(
            rows, self.frame_buckets, self.cost, self.tick_budget_s, self.max_streams
        )
        return calls

    def _deadline(self, s: StreamState, now: float) -> float:
        """When ``s``'s player runs dry (no prebuffer): its first audio plus the audio handed out since. A
        stream without audio yet (``first_chunks``): ``lead``, it has been due since it opened, so it goes
        before every playing stream; ``yield``, it counts as starting now with the audio it will have in
        hand (its decode in flight, else its first chunk), so a playing stream that runs dry sooner goes
        first: a stream not playing cannot stall, only start later, and at 192-256 streams joining at
        once on the H200 most underruns were a playing stream's second chunk queued behind the others'
        first ones (docs/benchmarks.md). A chunk ready for ``max_wait_s`` is due then at the latest: under
        load a stream seconds ahead of its listener was otherwise put off past the gateway's 3 s stall
        timeout (55 of 128 streams on the H200, docs/benchmarks.md)."""
        if s.first_audio_at is None:
            if self.first_chunks == "lead":
                return s.opened_at
            dry = now + (s.flight_frames or s.initial_frames) * self.spf / self.sample_rate
        else:
            dry = s.first_audio_at + (s.sample_offset + s.flight_frames * self.spf) / self.sample_rate
        return dry if s.ready_since is None else min(dry, s.ready_since + self.max_wait_s)

    def recover(self, exc: Exception) -> tuple[list[str], list[CodecOutput]]:
        """``step`` raised ``exc`` (not a device failure): the streams of the failed decode (all when
        unknown), and any whose launched decode was lost with it, are cancelled. Returns their ids and the
        audio the step had produced for the others; their decodes still in flight are collected later."""
        kept = {id(s) for group in self._in_flight_groups() for s, _ in group.work}
        failed = self._working or list(self._streams.values())
        failed = failed + [s for s in self._streams.values() if s.in_flight and id(s) not in kept]
        self._working = []
        ids = list(dict.fromkeys(s.stream_id for s in failed if self._streams.get(s.stream_id) is s))
        for sid in ids:
            log.error("codec: stream %s ended: %s", sid, one_line(exc))
            self.cancel(sid)
        return ids, [o for o in self._partial if o.stream_id not in ids]

    def _launch(
        self, call: Call[StreamState], calls: DecodeCalls | None = None, top: bool = False
    ) -> Launched:
        """Launch ``call`` through ``calls`` (the engine's own by default); padding rows take scratch slots
        from the bottom of the pool's scratch half, or with ``top`` from its top (``lanes``: two lanes'
        decodes may run at once, and a batch bucket pads fewer rows than half the engine's streams, so the
        two ranges never meet)."""
        work = [(row.stream, row.frames) for row in call.rows]
        t_bucket = call.frames
        self._working = [stream for stream, _ in work]
        b_real = len(work)
        # Power-of-two batch buckets bound how many graphs exist; capping at max_streams keeps a full
        # engine on its own (graphed) bucket instead of padding 300 rows to 512.
        b_bucket = batch_bucket(b_real, self.max_streams)
        codes = np.zeros((b_bucket, self.num_groups, t_bucket), dtype=np.int64)
        lengths = np.zeros(b_bucket, dtype=np.int64)
        slots = np.empty(b_bucket, dtype=np.int64)
        contexts = [row.context for row in call.rows]
        ready = []
        for i, ((stream, n), ctx) in enumerate(zip(work, contexts, strict=True)):
            new, frames_in = stream.take(n)
            ready.append(frames_in)
            if ctx:
                assert stream.history is not None
                codes[i, :, :ctx] = stream.history[-ctx:].T
            if self.left_context:
                seen = new if stream.history is None else np.concatenate([stream.history, new])
                stream.history = seen[-self.left_context :]
            codes[i, :, ctx : ctx + n] = new.T
            lengths[i] = ctx + n
            slots[i] = stream.slot
        pad = b_bucket - b_real
        first = 2 * self.max_streams - pad if top else self.max_streams
        slots[b_real:] = np.arange(first, first + pad)
        # Through pinned memory: a copy from these (pageable) arrays would wait for the decode in flight.
        slots_t = to_device(torch.from_numpy(slots), self.device)
        if self.left_context:
            self.codec.reset(slots_t[:b_real])  # every chunk starts from frame 0 of its window
        wav = (calls or self.calls)(
            to_device(torch.from_numpy(codes), self.device),
            slots_t,
            to_device(torch.from_numpy(lengths), self.device),
        )
        count_rows(work, contexts, b_bucket * t_bucket)
        for stream, n in work:
            stream.in_flight += 1
            stream.flight_frames += n
            stream.ready_since = None
        launched = Launched(work, contexts, *read_back(wav[:b_real]), ready, time.perf_counter())
        self._working = []
        return launched

    def _collect(self, launched: Launched, outputs: list[CodecOutput]) -> None:
        self._working = [stream for stream, _ in launched.work]
        if launched.event is not None:
            launched.event.synchronize()
        wav_np = launched.pcm.numpy()
        now = time.perf_counter()
        for i, ((stream, n), ctx) in enumerate(zip(launched.work, launched.contexts, strict=True)):
            stream.in_flight -= 1
            stream.flight_frames -= n
            if self._streams.get(stream.stream_id) is not stream:
                continue  # cancelled while its decode was in flight
            pcm = wav_np[i, ctx * self.spf : (ctx + n) * self.spf]
            drop = min(stream.prefix_frames, n)
            if drop:
                stream.prefix_frames -= drop
                pcm = pcm[drop * self.spf :]
                if not stream.prefix_frames and stream.voice is not None:
                    self._store_voice_state(stream)
            real = n - drop
            stream.emitted_frames += real
            stream.segment_emitted += real
            if pcm.size:
                stream.observe_chunk(real >= self.schedule.steady_frames, pcm.size / self.sample_rate,
                                     launched.ready[i], launched.launched_at, now)  # fmt: skip
            seg_end = stream.mark_due()
            if seg_end:
                stream.pass_mark()
            final = stream.drained()
            if real or final or seg_end:
                if pcm.size and stream.first_audio_at is None:
                    stream.first_audio_at = now  # the player's clock (the deadline policy) starts here
                outputs.append(CodecOutput(stream.stream_id, pcm, stream.sample_offset, final, real, seg_end))
                stream.sample_offset += pcm.size
            if final:
                self._release(self._streams.pop(stream.stream_id))
        self._working = []

    def _context(self, s: StreamState) -> int:
        """Frames decoded again in front of ``s``'s next chunk (overlap+crop only)."""
        return 0 if s.history is None else min(self.left_context, s.history.shape[0])

    def _ready_frames(self, s: StreamState) -> int:
        if s.prefix_frames:
            # Reference prefix: decoded as soon as the stream opens, on its own, so the chunks after it are
            # the same whether the talker's first frames came before its decode or not, or the decode was
            # skipped for a voice state (voice_states): the same PCM either way.
            return min(s.prefix_frames, self.schedule.max_frames_per_decode)
        if s.marks:  # the segment's frames are all in: decode up to the mark as if the input had ended
            left = s.marks[0] - s.emitted_frames
            return self.schedule.take(s.segment_emitted, left, True, s.initial_frames) if left > 0 else 0
        return self.schedule.take(s.scheduled, s.pending_frames, s.ended, s.initial_frames)

    def _snapshots(self) -> SnapshotCodec:
        # voice_states is only given with a pool that has snapshot/restore (build_engine asks the runtime).
        return cast(SnapshotCodec, self.codec)

    def _store_voice_state(self, stream: StreamState) -> None:
        """``stream`` has just decoded its whole prefix and nothing else: its slot state is the voice's."""
        assert self.voice_states is not None and stream.voice is not None
        key, prefix = stream.voice
        stream.voice = None
        self.voice_states.put(key, prefix, self._snapshots().snapshot(stream.slot))

    def _check_codes(self, codes: np.ndarray) -> None:
        if codes.ndim != 2 or codes.shape[1] != self.num_groups:
            raise ValueError(f"codes must be [frames, {self.num_groups}], got {codes.shape}")
        # Checked on the host: an out-of-range index on a GPU is a device-side assert that kills the process.
        if codes.size and (int(codes.min()) < 0 or int(codes.max()) >= self.codebook_size):
            raise ValueError(f"codes must lie in [0, {self.codebook_size})")

    def _get(self, stream_id: str) -> StreamState:
        try:
            return self._streams[stream_id]
        except KeyError:
            raise KeyError(f"no open codec stream {stream_id!r}") from None

    def _release(self, stream: StreamState) -> None:
        self._free.append(stream.slot)
        self._update_gauges()

    def _update_gauges(self) -> None:
        metrics.ACTIVE_STREAMS.labels(stage="codec").set(len(self._streams))
        metrics.SLOTS_IN_USE.labels(stage="codec").set(len(self._streams))
