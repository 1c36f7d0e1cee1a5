"""The codec engine (and the reference-audio encoders) on one thread, bridged to the event loop.

Every model call of the codec stage runs on this thread: streaming decode ticks, and the encoder and speaker
encoder for voice-clone references (they run between ticks, so a long reference delays other streams' next
chunk by its encode time, never races them). The servicer side sees coroutines and ``StageFailure``.

A stream's frames go in fire and forget (``push``): every stream's frames of one turn of the event loop (the
talker's frames of a tick arrive together over the link) reach the engine thread as one hand-off, not one
cross-thread call, future and loop wake-up per stream and message. A push that fails (the engine refuses the
codes, or the stream is gone) ends that stream only, through its listener's ``on_session_error``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from services.codec.engine import CodecAdmissionError, CodecEngine, CodecOutput
from services.codec.models import CodecRuntime
from voxstage.stage.engine_loop import log_capture, run_until_idle
from voxstage.stage.worker import SessionWorker

log = logging.getLogger(__name__)


class PcmListener(Protocol):
    def on_pcm(self, output: CodecOutput) -> None: ...

    def on_engine_failed(self, message: str) -> None: ...

    def on_request_failed(self, message: str) -> None: ...

    def on_session_error(self, code: str, message: str) -> None:
        """A fire-and-forget command of this stream failed (``push``); the engine has let it go."""
        ...


@dataclass(frozen=True)
class CodecSnapshot:
    ticks: int
    slots_total: int
    slots_in_use: int
    buffered: dict[str, int]  # stream key -> frames received and not yet decoded


@dataclass(frozen=True)
class Reference:
    codes: np.ndarray | None  # [frames, groups] int64 (ICL, or a family that clones from codes)
    x_vector: np.ndarray | None  # float32 [dim]; None for a family without a speaker encoder


class CodecWorker(SessionWorker[CodecOutput, PcmListener]):
    role = "codec"
    admission_errors = (CodecAdmissionError,)
    invalid_errors = (ValueError,)  # bad codes, bad schedule values, unusable reference audio

    def __init__(self, runtime: CodecRuntime, engine: CodecEngine) -> None:
        self.runtime = runtime
        self.engine = engine
        super().__init__(engine)

    # -- lifecycle ---------------------------------------------------------------------------------------
    async def warm_up(self) -> float:
        """Decode a short synthetic stream (and encode a reference on Base checkpoints), on the engine
        thread."""
        rt = self.runtime

        def run() -> float:
            t0 = time.perf_counter()
            self.engine.open("__warmup__")
            self.engine.push("__warmup__", np.zeros((2, rt.num_groups), np.int64))
            self.engine.finish("__warmup__")
            run_until_idle(self.engine)  # to the end, also where two lanes' decodes are still running
            log_capture(log, "codec", self._capture_graphs)
            if rt.voice_clone:
                noise = np.random.default_rng(0).standard_normal(rt.sample_rate).astype(np.float32) * 0.1
                rt.encode_reference(noise, rt.sample_rate)
                rt.speaker_embedding(noise, rt.sample_rate)
            return time.perf_counter() - t0

        return await self._call(run)

    def _capture_graphs(self) -> int:
        """The start-up graphs (engine thread): the calls the tick policy can make, up to every stream due
        with one whole chunk in the same tick. Bounded (deadline) ticks never make a call over their budget
        but a single row's, so they are timed first and only the buckets within it captured: at 256 streams
        the whole set reserved over 70 GiB. With lanes (``services.codec.lanes``) each lane captures its
        own. Returns how many graphs the warm-up captured."""
        engine = self.engine
        start_up = engine.start_up_calls()
        before = sum(calls.captured() for calls, _ in start_up)
        if engine.needs_cost:
            t_cal = time.perf_counter()
            cost = engine.calibrate()  # times graphed calls, capturing each shape it times
            log.info(
                "codec: decode costs measured in %.1f s for ticks of %g ms: %s",
                time.perf_counter() - t_cal, 1e3 * engine.tick_budget_s, cost.describe(),
            )  # fmt: skip
        for calls, keep in start_up:
            calls.capture_all(engine.max_streams * engine.schedule.steady_frames, keep)
        return sum(calls.captured() for calls, _ in start_up) - before

    # -- streams -------------------------------------------------------------------------------------------
    def has_room(self) -> bool:
        """A slot is free, as far as the loop can tell (the engine, deciding on its thread, has the last
        word): every stream the engine holds has a listener until its last output or its cancel."""
        return len(self._listeners) < self.engine.max_streams

    def open(
        self,
        key: str,
        *,
        initial_frames: int,
        prefix: np.ndarray | None,
        listener: PcmListener,
        voice_key: str = "",
    ) -> asyncio.Task[int]:
        """Admit a stream: handed to the engine thread now (codes pushed later follow it); the task gives its
        slot index, or the ``StageFailure`` that refused it. ``prefix`` codes are decoded first and their
        audio dropped, or, for a voice-library voice (``voice_key``) whose state the engine keeps, not
        decoded at all."""
        self._listeners[key] = listener
        try:
            fut = self._submit(
                lambda: self.engine.open(
                    key, initial_frames=initial_frames, prefix=prefix, prefix_key=voice_key
                )
            )
        except BaseException:
            self._listeners.pop(key, None)
            raise
        return asyncio.ensure_future(self._opened(key, fut))

    async def _opened(self, key: str, fut: asyncio.Future[int]) -> int:
        try:
            return await self._result(fut)
        except BaseException:
            self._listeners.pop(key, None)
            raise

    def push(self, key: str, codes: np.ndarray) -> None:
        """Queue ``codes`` for the stream; they reach the engine with every other push of this turn of the
        event loop, and before any later command of this worker (``_call`` and ``cancel`` hand them over
        first)."""
        self._command(key, lambda: self.engine.push(key, codes))

    async def end_segment(self, key: str) -> None:
        await self._call(lambda: self.engine.end_segment(key))

    async def finish(self, key: str) -> None:
        await self._call(lambda: self.engine.finish(key))

    def cancel(self, key: str) -> None:
        """Free the stream's state before the next tick; no further output reaches its listener."""
        self._listeners.pop(key, None)
        if self.failed is None:
            self.flush_commands()
            self._thread.call(lambda: self.engine.cancel(key))

    async def reference(self, pcm: np.ndarray, sample_rate: int, *, with_codes: bool) -> Reference:
        """x-vector (and, for ICL, the reference codes) of a voice-clone clip, on the engine thread."""
        rt = self.runtime

        def run() -> Reference:
            xvec = rt.speaker_embedding(pcm, sample_rate)
            codes = rt.encode_reference(pcm, sample_rate) if with_codes or rt.clone_from_codes else None
            return Reference(codes=codes, x_vector=xvec)

        return await self._call(run)

    async def snapshot(self) -> CodecSnapshot:
        def run() -> CodecSnapshot:
            e = self.engine
            buffered = {sid: e.buffered_frames(sid) for sid in e.stream_ids()}
            return CodecSnapshot(e.ticks, e.max_streams, e.active(), buffered)

        return await self._call(run)

    # -- engine thread -------------------------------------------------------------------------------------
    def _end_session(self, key: str) -> None:
        self.engine.cancel(key)

    # -- engine thread -> event loop ----------------------------------------------------------------------
    def _route(self, output: CodecOutput) -> tuple[str, bool]:
        return output.stream_id, output.final

    def _deliver(self, listener: PcmListener, output: CodecOutput) -> None:
        listener.on_pcm(output)
