"""The duplex talker engine on its own thread, and the bridge between it and the event loop.

Like ``TalkerWorker`` for text-to-speech: the duplex stream (gRPC, no torch) posts session commands here,
the engine thread applies them between steps, and each step's ``DuplexOutput`` reaches the session's
listener on the event loop.
"""

from __future__ import annotations

import logging
import secrets
import time

import numpy as np

from services.talker.budget import RequestBudget
from services.talker.duplex.engine import DuplexEngine, DuplexOutput, DuplexRequest
from services.talker.models import TalkerInfo
from services.talker.worker import (
    MAX_SEED,
    PhaseTracker,
    RequestParams,
    TalkerDefaults,
    TalkerSnapshot,
    apply_overrides,
)
from voxstage.duplex import DuplexAdmissionError, DuplexListener
from voxstage.quote import quoted
from voxstage.stage.engine_loop import log_capture
from voxstage.stage.errors import StageFailure
from voxstage.stage.worker import SessionWorker

log = logging.getLogger(__name__)


class DuplexWorker(SessionWorker[DuplexOutput, DuplexListener[DuplexOutput]]):
    role = "talker"
    admission_errors = (DuplexAdmissionError,)
    invalid_errors = (ValueError,)  # PromptError is a ValueError

    def __init__(self, engine: DuplexEngine, info: TalkerInfo, defaults: TalkerDefaults) -> None:
        self.engine = engine
        self.info = info
        self.defaults = defaults
        self._tracked = PhaseTracker(engine, engine.session_state)
        self.budget: RequestBudget | None = None  # measured at warm-up
        super().__init__(self._tracked)

    async def warm_up(self) -> float:
        """One short synthetic session through the engine (prompt, a few frames, close), then every CUDA
        graph captured; returns the seconds it took."""

        def run() -> float:
            t0 = time.perf_counter()
            e = self.engine
            d = self.defaults
            # A session's whole prompt must fit its window (DuplexEngine.open); then it slides.
            self.budget = RequestBudget.of(e.adapter, self.info, e.cfg.window, reserve=0)
            voice = self.info.voices[0] if self.info.voices else None
            e.open(DuplexRequest("__warmup__", "Warm up.", voice, None, 0, d.sampling, d.subtalker))
            silence = np.zeros((1, self.info.num_code_groups), np.int64)
            for i in range(3):
                while e.session_state("__warmup__") == "prefill":
                    e.step()
                e.push_user("__warmup__", i, silence)
                e.step()
            e.close("__warmup__")
            e.step()
            log_capture(log, "talker", e.adapter.capture_all_graphs)
            return time.perf_counter() - t0

        return await self._call(run)

    def check_voice(self, params: RequestParams) -> None:
        voices = self.info.voices
        if params.voice and params.voice not in voices:
            known = ", ".join(voices) or "none"
            raise StageFailure("NOT_FOUND", f"voice: {quoted(params.voice)} is not a stored voice ({known})")

    def build_request(self, key: str, params: RequestParams) -> DuplexRequest:
        d = self.defaults
        seed = params.seed if params.seed is not None else d.seed
        if seed is None:
            seed = secrets.randbits(63)
        elif not 0 <= seed <= MAX_SEED:
            raise StageFailure("INVALID_ARGUMENT", f"seed: must be in [0, 2**63), got {seed}")
        return DuplexRequest(
            key,
            persona=params.instructions or "",
            voice=params.voice or None,
            voice_codes=params.ref_codes,
            seed=seed,
            text=apply_overrides(d.sampling, params.sampling, "sampling"),
            audio=apply_overrides(d.subtalker, params.subtalker, "subtalker_sampling"),
        )

    async def open(self, request: DuplexRequest, listener: DuplexListener[DuplexOutput]) -> None:
        key = request.session_id
        self._listeners[key] = listener

        def run() -> None:
            self.engine.open(request)
            self._tracked.phases[key] = ("prefill", self.engine.ticks)
            self._tracked.admitted_at[key] = time.perf_counter()  # sessions never queue

        try:
            await self._call(run)
        except BaseException:
            self._listeners.pop(key, None)
            raise

    def push_user(self, key: str, first_index: int, codes: np.ndarray) -> None:
        """Queue user frames (fire and forget: an error fails only this session, through its listener)."""
        self._command(key, lambda: self.engine.push_user(key, first_index, codes))

    def close(self, key: str) -> None:
        self._command(key, lambda: self.engine.close(key))

    def cancel(self, key: str) -> None:
        if self.failed is None:
            self.flush_commands()
            self._thread.call(lambda: self.engine.cancel(key))

    def forget(self, key: str) -> None:
        self._listeners.pop(key, None)
        self._tracked.admitted_at.pop(key, None)

    def admitted_at(self, key: str) -> float | None:
        return self._tracked.admitted_at.get(key)

    async def snapshot(self) -> TalkerSnapshot:
        def run() -> TalkerSnapshot:
            e = self.engine
            return TalkerSnapshot(e.ticks, e.cfg.max_sessions, e.sessions(), 0, self._tracked.requests())

        return await self._call(run)

    def _end_session(self, key: str) -> None:
        self.engine.cancel(key)

    # -- engine thread -> event loop ----------------------------------------------------------------------
    def _route(self, output: DuplexOutput) -> tuple[str, bool]:
        return output.session_id, output.finish is not None

    def _deliver(self, listener: DuplexListener[DuplexOutput], output: DuplexOutput) -> None:
        listener.on_output(output)
