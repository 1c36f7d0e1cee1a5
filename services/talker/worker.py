"""The talker engine on its own thread, and the bridge between it and the event loop.

The servicer (gRPC, no torch) talks to ``TalkerWorker`` only: it builds requests from family-neutral
``RequestParams``, posts engine commands to the engine thread (``voxstage.stage.engine_loop.EngineThread``)
and receives each tick's ``TalkerOutput`` on the event loop through a per-request ``OutputListener``. Engine
exceptions come back as ``StageFailure`` with the status the protocol assigns (docs/protocol.md §7).
"""

from __future__ import annotations

import dataclasses
import logging
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import numpy as np

from services.talker.budget import RequestBudget
from services.talker.engine import AdmissionError, RequestTooLarge, TalkerEngine, TalkerOutput, TalkerRequest
from services.talker.models import TalkerInfo
from services.talker.sampling import SamplingParams
from services.talker.spec import SpeechSpec
from voxstage import limits
from voxstage.config import SamplingParams as DeploySampling
from voxstage.config import SegmentsConfig, StageConfig
from voxstage.quote import quoted
from voxstage.segments import FrameCap
from voxstage.stage.engine_loop import Steppable, log_capture, run_until_idle
from voxstage.stage.errors import StageFailure
from voxstage.stage.worker import StageWorker

log = logging.getLogger(__name__)
O = TypeVar("O")
MAX_SEED = limits.SEED.end - 1  # [0, 2**63): src/voxstage/limits.py, shared with the gateway


@dataclass(frozen=True)
class SegmentPolicy:
    """How a stream's segments start and how long each may run (voxstage.segments)."""

    early_start_chars: int = 0  # 0: a segment waits for its flush
    cap: FrameCap | None = None
    frame_rate_hz: float = 12.5

    @classmethod
    def from_deploy(cls, cfg: SegmentsConfig | None, info: TalkerInfo) -> SegmentPolicy:
        cfg = cfg or SegmentsConfig()
        cap = (
            FrameCap(cfg.frame_cap_floor_s, cfg.frame_cap_s_per_char, cfg.frame_cap_s_per_wide_char)
            if cfg.frame_cap
            else None
        )
        early = cfg.early_start_chars if info.streams_text else 0
        return cls(early_start_chars=early, cap=cap, frame_rate_hz=info.frame_rate_hz)

    def frame_cap(self, text: str) -> int | None:
        return None if self.cap is None else self.cap.frames(text, self.frame_rate_hz)


@dataclass(frozen=True)
class TalkerDefaults:
    """Per-request defaults: the checkpoint's generation config overlaid with the deploy file's keys."""

    sampling: SamplingParams
    subtalker: SamplingParams
    seed: int | None
    max_frames: int
    min_frames: int
    segments: SegmentPolicy = field(default_factory=SegmentPolicy)

    @classmethod
    def from_deploy(cls, stage: StageConfig, info: TalkerInfo) -> TalkerDefaults:
        dsp = stage.default_sampling_params
        sub = stage.subtalker_sampling_params
        return cls(
            sampling=_overlay(info.default_sampling, dsp),
            subtalker=info.default_subtalker_sampling
            if sub is None
            else _overlay(info.default_subtalker_sampling, sub),
            seed=dsp.seed,
            max_frames=dsp.max_tokens or info.max_new_frames,
            min_frames=dsp.min_tokens,
            segments=SegmentPolicy.from_deploy(stage.segments, info),
        )


def _overlay(base: SamplingParams, deploy: DeploySampling) -> SamplingParams:
    # Only keys the deploy file actually sets replace the checkpoint's values: the schema's own defaults
    # (temperature 1.0, top_k -1, ...) must not silently override a generation_config.json.
    given = deploy.model_fields_set
    out = base
    if "temperature" in given:
        out = dataclasses.replace(out, temperature=deploy.temperature)
    if "top_k" in given:
        out = dataclasses.replace(out, top_k=max(deploy.top_k, 0))  # deploy -1 = off = our 0
    if "top_p" in given:
        out = dataclasses.replace(out, top_p=deploy.top_p)
    if "repetition_penalty" in given:
        out = dataclasses.replace(out, repetition_penalty=deploy.repetition_penalty)
    if given & {"do_sample", "temperature", "top_k"}:
        out = dataclasses.replace(out, do_sample=not deploy.greedy)
    return out


@dataclass
class RequestParams:
    """What one Talker.Stream asks for, decoded from the wire (family-neutral)."""

    voice: str | None = None
    language: str = "auto"
    instructions: str | None = None
    seed: int | None = None
    # Overrides by SamplingParams field name; top_k already mapped to our 0 = off.
    sampling: dict[str, Any] = field(default_factory=dict)
    subtalker: dict[str, Any] = field(default_factory=dict)
    max_frames: int | None = None
    non_streaming: bool | None = None
    speaker_embedding: np.ndarray | None = None
    ref_text: str | None = None
    ref_codes: np.ndarray | None = None
    whole_clip: bool = False  # its client hears nothing before the end: never held by pacing


class OutputListener(Protocol):
    def on_output(self, output: TalkerOutput) -> None: ...

    def on_engine_failed(self, message: str) -> None: ...

    def on_request_failed(self, message: str) -> None: ...


@dataclass(frozen=True)
class RequestSnapshot:
    state: str  # the engine's phase of it: waiting | prefill | decode
    slot: int
    last_tick: int
    admitted_at: float | None


@dataclass(frozen=True)
class TalkerSnapshot:
    ticks: int
    slots_total: int
    slots_in_use: int
    queue_depth: int
    requests: dict[str, RequestSnapshot]


class TrackedEngine(Protocol[O]):
    """What the tracker needs of a talker engine (text-to-speech or duplex)."""

    ticks: int

    def has_work(self) -> bool: ...

    def step(self) -> list[O]: ...

    def idle_timeout(self) -> float | None: ...

    def slot_of(self, key: str) -> int: ...

    def recover(self, exc: Exception) -> tuple[list[str], list[O]]: ...


class PhaseTracker(Steppable[O]):
    """What the engine thread drives for both talker workers: the engine plus each request's (or session's)
    phase and the tick it changed; leaving ``waiting`` is its admission."""

    def __init__(self, engine: TrackedEngine[O], state_of: Callable[[str], str]) -> None:
        self.engine = engine
        self.state_of = state_of  # key -> phase, "absent" once the engine forgot it
        self.phases: dict[str, tuple[str, int]] = {}
        self.admitted_at: dict[str, float] = {}

    def has_work(self) -> bool:
        return self.engine.has_work()

    def idle_timeout(self) -> float | None:
        return self.engine.idle_timeout()

    def step(self) -> list[O]:
        outputs = self.engine.step()
        tick = self.engine.ticks
        for key, (old, _) in list(self.phases.items()):
            state = self.state_of(key)
            if state == "absent":
                del self.phases[key]
            elif state != old:
                self.phases[key] = (state, tick)
                if old == "waiting":
                    self.admitted_at[key] = time.perf_counter()
        return outputs

    def requests(self) -> dict[str, RequestSnapshot]:
        """Engine thread: every tracked request's phase, slot, tick of its last change and admission."""
        return {
            key: RequestSnapshot(state, self.engine.slot_of(key), tick, self.admitted_at.get(key))
            for key, (state, tick) in self.phases.items()
        }

    def recover(self, exc: Exception) -> tuple[list[str], list[O]]:
        return self.engine.recover(exc)


class TalkerWorker(StageWorker[TalkerOutput, OutputListener]):
    role = "talker"
    admission_errors = (AdmissionError,)
    invalid_errors = (RequestTooLarge, ValueError)  # PromptError is a ValueError

    def __init__(self, engine: TalkerEngine, info: TalkerInfo, defaults: TalkerDefaults) -> None:
        self.engine = engine
        self.info = info
        self.defaults = defaults
        self._tracked = PhaseTracker(engine, engine.request_state)
        self.budget: RequestBudget | None = None  # measured at warm-up
        super().__init__(self._tracked)

    # -- lifecycle (event loop) -------------------------------------------------------------------------
    async def warm_up(self, spec: SpeechSpec) -> float:
        """One short synthetic request through the engine (on its thread), then every CUDA graph captured
        (adapters that have them); returns the seconds it all took."""

        def run() -> float:
            t0 = time.perf_counter()
            d = self.defaults
            # A prompt must leave room for min_frames (and one frame at least): TalkerEngine._check_fits.
            reserve = max(d.min_frames, 1)
            max_len = self.engine.cfg.max_model_len
            self.budget = RequestBudget.of(self.engine.adapter, self.info, max_len, reserve)
            req = TalkerRequest("__warmup__", spec, 0, d.sampling, d.subtalker, max_frames=2, min_frames=0)
            self.engine.submit(req)
            run_until_idle(self.engine)  # to the end, also where a paced step waits for its time
            adapter = self.engine.adapter
            variants = adapter.graph_variants(d.sampling, d.subtalker)  # families with sampler variants
            log_capture(log, "talker", lambda: adapter.capture_all_graphs(variants))
            return time.perf_counter() - t0

        return await self._call(run)

    # -- requests (event loop) --------------------------------------------------------------------------
    def check_voice(self, params: RequestParams) -> None:
        """Cheap checks that need no model code, so an unknown voice is refused before ``opened``."""
        voices = self.info.voices
        if params.voice and voices and params.voice.lower() not in voices:
            known = ", ".join(voices)
            raise StageFailure("NOT_FOUND", f"voice: {quoted(params.voice)} is not one of {known}")
        if not params.voice and self.info.catalog.voice_required:
            raise StageFailure(
                "INVALID_ARGUMENT", f"voice: required by {self.info.model}; one of {', '.join(voices)}"
            )
        if params.language.lower() not in self.info.languages:
            known = ", ".join(self.info.languages)
            why = f"language: {quoted(params.language)} is not supported; use one of {known}"
            raise StageFailure("INVALID_ARGUMENT", why)

    def frame_limit(self, params: RequestParams, text: str) -> tuple[int, bool]:
        """(max frames of a take speaking ``text``, whether the text-derived cap is what binds)."""
        if params.max_frames:
            return params.max_frames, False  # the request's own budget replaces the cap
        budget = self.defaults.max_frames
        cap = self.defaults.segments.frame_cap(text)
        if cap is not None and cap < budget:
            return cap, True
        return budget, False

    def build_request(
        self, key: str, params: RequestParams, text: str, complete: bool, max_frames: int | None = None
    ) -> TalkerRequest:
        d = self.defaults
        seed = params.seed if params.seed is not None else d.seed
        if seed is None:
            seed = secrets.randbits(63)  # no deploy default: every request samples afresh
        elif (why := limits.SEED.problem(seed)) is not None:
            raise StageFailure("INVALID_ARGUMENT", f"seed: {why}")  # the gateway refuses with the same words
        spec = SpeechSpec(
            text=text,
            voice=params.voice or None,
            language=params.language,
            instructions=params.instructions or None,
            speaker_embedding=params.speaker_embedding,
            ref_text=params.ref_text or None,
            ref_codes=params.ref_codes,
            non_streaming=params.non_streaming,
            text_complete=complete,
        )
        sampling = apply_overrides(d.sampling, params.sampling, "sampling")
        subtalker = apply_overrides(d.subtalker, params.subtalker, "subtalker_sampling")
        try:
            self.engine.adapter.check_sampling(sampling, subtalker)  # a family's own sampling limits
        except ValueError as exc:
            raise StageFailure("INVALID_ARGUMENT", str(exc)) from None
        return TalkerRequest(
            key,
            spec,
            seed=seed,
            sampling=sampling,
            subtalker=subtalker,
            max_frames=max_frames or params.max_frames or d.max_frames,
            min_frames=d.min_frames,
            whole_clip=params.whole_clip,
        )

    async def submit(
        self, request: TalkerRequest, listener: OutputListener, follows: str | None = None
    ) -> None:
        key = request.request_id
        self._listeners[key] = listener

        def run() -> None:
            self.engine.submit(request, follows)
            self._tracked.phases[key] = ("waiting", self.engine.ticks)

        try:
            await self._call(run)
        except BaseException:
            self._listeners.pop(key, None)
            raise

    async def push_text(self, key: str, text: str, complete: bool, max_frames: int | None = None) -> None:
        await self._call(lambda: self.engine.push_text(key, text, complete, max_frames))

    def cancel(self, key: str) -> None:
        """Ask the engine to free the request's slot at the next tick boundary (its CANCELLED output
        still reaches the listener, which stays registered until then)."""
        if self.failed is None:
            self._thread.call(lambda: self.engine.cancel(key))

    def forget(self, key: str) -> None:
        """The stream is gone: later outputs of ``key`` are dropped."""
        self._listeners.pop(key, None)
        self._thread.call(lambda: self._tracked.admitted_at.pop(key, None))

    def admitted_at(self, key: str) -> float | None:
        """When the request got its slot (perf_counter), for the queued timing; None while waiting."""
        return self._tracked.admitted_at.get(key)  # a dict read is atomic; the engine thread writes it

    async def snapshot(self) -> TalkerSnapshot:
        def run() -> TalkerSnapshot:
            e = self.engine
            reqs = self._tracked.requests()
            return TalkerSnapshot(e.ticks, e.cfg.max_num_seqs, e.slots_in_use(), e.queue_depth(), reqs)

        return await self._call(run)

    # -- engine thread -> event loop ----------------------------------------------------------------------
    def _route(self, output: TalkerOutput) -> tuple[str, bool]:
        return output.request_id, output.finish is not None

    def _deliver(self, listener: OutputListener, output: TalkerOutput) -> None:
        listener.on_output(output)


def apply_overrides(base: SamplingParams, overrides: dict[str, Any], name: str) -> SamplingParams:
    if not overrides:
        return base
    values = dict(overrides)
    if "temperature" in values and "do_sample" not in values:
        # A request temperature of 0 means greedy, whatever the deploy default's do_sample says.
        values["do_sample"] = values["temperature"] > 0
    try:
        return dataclasses.replace(base, **values)
    except ValueError as exc:
        raise StageFailure("INVALID_ARGUMENT", f"{name}: {exc}") from exc
