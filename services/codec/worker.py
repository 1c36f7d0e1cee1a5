"""The codec engine (and the reference-audio encoders) on one thread, bridged to the event loop.

Every model call of the codec stage runs on this thread: streaming decode ticks, and the encoder and speaker
encoder for voice-clone references (they run between ticks, so a long reference delays other streams' next
chunk by its encode time, never races them). The servicer side sees coroutines and ``StageFailure``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, TypeVar

import numpy as np

from voxstage.codec.engine import CodecAdmissionError, CodecEngine, CodecOutput
from voxstage.codec.models import CodecRuntime
from voxstage.engine_loop import EngineThread
from voxstage.stage_errors import StageFailure

log = logging.getLogger(__name__)
T = TypeVar("T")


class PcmListener(Protocol):
    def on_pcm(self, output: CodecOutput) -> None: ...

    def on_engine_failed(self, message: str) -> None: ...


@dataclass(frozen=True)
class CodecSnapshot:
    ticks: int
    slots_total: int
    slots_in_use: int
    buffered: dict[str, int]  # stream key -> frames received and not yet decoded


@dataclass(frozen=True)
class Reference:
    codes: np.ndarray | None  # [frames, groups] int64 (ICL only)
    x_vector: np.ndarray  # float32 [dim]


class CodecWorker:
    def __init__(self, runtime: CodecRuntime, engine: CodecEngine) -> None:
        self.runtime = runtime
        self.engine = engine
        self._thread = EngineThread(engine, self._sink, name="codec-engine", on_error=self._on_error)
        self._listeners: dict[str, PcmListener] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._on_fatal: Callable[[str], None] | None = None
        self.failed: str | None = None

    # -- lifecycle ---------------------------------------------------------------------------------------
    def start(self, loop: asyncio.AbstractEventLoop, on_fatal: Callable[[str], None] | None = None) -> None:
        self._loop = loop
        self._on_fatal = on_fatal
        self._thread.start()

    def stop(self) -> None:
        self._thread.stop()

    async def warm_up(self) -> float:
        """Decode a short synthetic stream (and encode a reference on Base checkpoints), on the engine
        thread."""
        rt = self.runtime

        def run() -> float:
            t0 = time.perf_counter()
            self.engine.open("__warmup__")
            self.engine.push("__warmup__", np.zeros((2, rt.num_groups), np.int64))
            self.engine.finish("__warmup__")
            while self.engine.has_work():
                self.engine.step()
            if rt.voice_clone:
                noise = np.random.default_rng(0).standard_normal(rt.sample_rate).astype(np.float32) * 0.1
                rt.encode_reference(noise, rt.sample_rate)
                rt.speaker_embedding(noise, rt.sample_rate)
            return time.perf_counter() - t0

        return await self._call(run)

    # -- streams -------------------------------------------------------------------------------------------
    async def open(
        self, key: str, *, initial_frames: int, prefix: np.ndarray | None, listener: PcmListener
    ) -> int:
        """Admit a stream (its slot index); ``prefix`` codes are decoded first and their audio dropped."""
        self._listeners[key] = listener
        try:
            return await self._call(
                lambda: self.engine.open(key, initial_frames=initial_frames, prefix=prefix)
            )
        except BaseException:
            self._listeners.pop(key, None)
            raise

    async def push(self, key: str, codes: np.ndarray) -> None:
        await self._call(lambda: self.engine.push(key, codes))

    async def finish(self, key: str) -> None:
        await self._call(lambda: self.engine.finish(key))

    def cancel(self, key: str) -> None:
        """Free the stream's state before the next tick; no further output reaches its listener."""
        self._listeners.pop(key, None)
        if self.failed is None:
            self._thread.call(lambda: self.engine.cancel(key))

    async def reference(self, pcm: np.ndarray, sample_rate: int, *, with_codes: bool) -> Reference:
        """x-vector (and, for ICL, the reference codes) of a voice-clone clip, on the engine thread."""
        rt = self.runtime

        def run() -> Reference:
            xvec = rt.speaker_embedding(pcm, sample_rate)
            codes = rt.encode_reference(pcm, sample_rate) if with_codes else None
            return Reference(codes=codes, x_vector=xvec)

        return await self._call(run)

    async def snapshot(self) -> CodecSnapshot:
        def run() -> CodecSnapshot:
            e = self.engine
            buffered = {sid: e.buffered_frames(sid) for sid in e.stream_ids()}
            return CodecSnapshot(e.ticks, e.max_streams, e.active(), buffered)

        return await self._call(run)

    # -- engine thread -> event loop ----------------------------------------------------------------------
    async def _call(self, fn: Callable[[], T]) -> T:
        if self.failed is not None:
            raise StageFailure("INTERNAL", f"codec engine failed: {self.failed}")
        try:
            return await asyncio.wrap_future(self._thread.call(fn))
        except CodecAdmissionError as exc:
            raise StageFailure("RESOURCE_EXHAUSTED", str(exc)) from exc
        except ValueError as exc:  # bad codes, bad schedule values, unusable reference audio
            raise StageFailure("INVALID_ARGUMENT", str(exc)) from exc
        except KeyError as exc:
            raise StageFailure("FAILED_PRECONDITION", str(exc.args[0] if exc.args else exc)) from exc
        except RuntimeError as exc:
            raise StageFailure("UNAVAILABLE", f"codec engine: {exc}") from exc

    def _sink(self, outputs: list[CodecOutput]) -> None:
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self._dispatch, outputs)

    def _dispatch(self, outputs: list[CodecOutput]) -> None:
        for out in outputs:
            listener = self._listeners.get(out.stream_id)
            if out.final:
                self._listeners.pop(out.stream_id, None)
            if listener is not None:
                listener.on_pcm(out)

    def _on_error(self, exc: BaseException) -> None:
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self._fail_all, f"{type(exc).__name__}: {exc}")

    def _fail_all(self, message: str) -> None:
        self.failed = message
        listeners, self._listeners = self._listeners, {}
        for listener in listeners.values():
            listener.on_engine_failed(message)
        if self._on_fatal is not None:
            self._on_fatal(message)
