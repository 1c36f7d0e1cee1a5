"""The duplex codec engine on its own thread, bridged to the event loop (like ``CodecWorker`` for TTS).

Duplex streams (gRPC, no torch) post session commands here; the engine thread applies them between ticks,
and each tick's ``UserCodes`` and each burst's ``AgentAudio`` reach the session's listener on the loop. A
command that fails fails that session only (through ``on_session_error``), never the engine.
Voice recordings are resampled and normalised on a helper thread (numpy, off the loop) and Mimi-encoded on
the engine thread between ticks.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from dataclasses import dataclass
from typing import Any

import numpy as np

from services.codec.duplex.engine import DuplexCodecEngine
from services.codec.duplex.types import AgentFrame, DuplexOutput
from voxstage.duplex import DuplexAdmissionError, DuplexListener
from voxstage.stage.errors import StageFailure
from voxstage.stage.worker import SessionWorker


@dataclass(frozen=True)
class DuplexCodecSnapshot:
    ticks: int
    slots_total: int
    slots_in_use: int
    buffered: dict[str, int]  # session key -> user-audio samples in its jitter buffer
    slots: dict[str, int]  # session key -> slot


class DuplexCodecWorker(SessionWorker[DuplexOutput, DuplexListener[DuplexOutput]]):
    role = "codec"
    admission_errors = (DuplexAdmissionError,)
    invalid_errors = (ValueError,)

    def __init__(self, runtime: Any, engine: DuplexCodecEngine) -> None:
        self.runtime = runtime  # DuplexCodecRuntime: the identity Status and the streams announce
        self.engine = engine
        super().__init__(engine)

    async def warm_up(self) -> float:
        return await self._call(self.engine.warm_up)

    # -- sessions ------------------------------------------------------------------------------------------
    async def reference_codes(self, pcm: np.ndarray, sample_rate: int) -> np.ndarray:
        """Mimi codes ``[frames, K]`` of a voice recording (any rate, mono float32)."""
        try:
            prepared = await asyncio.to_thread(self.runtime.prepare_recording, pcm, sample_rate)
        except ValueError as exc:
            raise StageFailure("INVALID_ARGUMENT", str(exc)) from exc
        future: concurrent.futures.Future[np.ndarray] = await self._call(
            lambda: self.engine.submit_reference(prepared)
        )
        try:
            return await asyncio.wrap_future(future)
        except ValueError as exc:
            raise StageFailure("INVALID_ARGUMENT", str(exc)) from exc
        except RuntimeError as exc:
            raise StageFailure("UNAVAILABLE", f"codec engine: {exc}") from exc
        except Exception as exc:  # noqa: BLE001 - a model failure on this recording fails this open only
            raise StageFailure("INTERNAL", f"voice recording: {type(exc).__name__}: {exc}") from exc

    async def join(self, key: str, listener: DuplexListener[DuplexOutput]) -> int:
        """Admit a session (RESOURCE_EXHAUSTED when every slot is held); it ticks after ``start_session``."""
        self._listeners[key] = listener
        try:
            return await self._call(lambda: self.engine.join(key))
        except BaseException:
            self._listeners.pop(key, None)
            raise

    def start_session(self, key: str) -> None:
        """The session ticks from the engine's next tick on."""
        self._command(key, lambda: self.engine.start(key))

    def end_input(self, key: str) -> None:
        self._command(key, lambda: self.engine.end_input(key))

    def push_audio(self, key: str, pcm: np.ndarray, first_sample: int) -> None:
        self._command(key, lambda: self.engine.push_audio(key, pcm, first_sample))

    def push_agent(self, key: str, frame: AgentFrame) -> None:
        self._command(key, lambda: self.engine.push_agent(key, frame))

    def leave(self, key: str) -> None:
        """Free the session's slot before the next tick; no further output reaches its listener."""
        self._listeners.pop(key, None)
        if self.failed is None:
            self.flush_commands()
            self._thread.call(lambda: self.engine.leave(key))

    async def snapshot(self) -> DuplexCodecSnapshot:
        def run() -> DuplexCodecSnapshot:
            e = self.engine
            infos = {sid: e.info(sid) for sid in e.session_ids()}
            return DuplexCodecSnapshot(
                e.ticks,
                e.cfg.max_sessions,
                e.sessions(),
                {sid: i.buffered for sid, i in infos.items()},
                {sid: i.slot for sid, i in infos.items()},
            )

        return await self._call(run)

    # -- engine thread -----------------------------------------------------------------------------------
    def _end_session(self, key: str) -> None:
        self.engine.leave(key)

    def _route(self, output: DuplexOutput) -> tuple[str, bool]:
        return output.session_id, False  # a session ends when its stream leaves, never by an output

    def _deliver(self, listener: DuplexListener[DuplexOutput], output: DuplexOutput) -> None:
        listener.on_output(output)

    def _fail_all(self, message: str) -> None:
        self.engine.references.fail_all(RuntimeError(f"engine failed: {message}"))
        super()._fail_all(message)
