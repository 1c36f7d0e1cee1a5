"""Pacing under load (services/talker/pacing.py): with enough requests in slots, frame steps start at least
the interval apart and a stream far ahead of real time sits steps out; the engine thread has nothing to do
meanwhile (it sleeps on ``idle_timeout``), the frames are the same as unpaced, and below the load threshold
nothing waits. The interval and the hold are floors the engine must keep, so a slow machine cannot break
these assertions."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

from services.talker.engine import EngineConfig, Finish, TalkerEngine, TalkerOutput
from services.talker.models.qwen3_tts.adapter import Qwen3TTSAdapter
from services.talker.models.qwen3_tts.model import Qwen3TTSTalker
from services.talker.models.qwen3_tts.tokenizer import QwenTextTokenizer
from services.talker.pacing import Pacing
from services.talker.request_params import request_params
from services.talker.spec import SpeechSpec
from services.talker.worker import TalkerDefaults, TalkerWorker
from tests.unit.talker.talker_kit import frames_of
from tests.unit.talker.test_talker_engine import request
from tests.unit.talker.test_talker_request_failures import INFO
from voxstage import metrics
from voxstage.config import StageConfig
from voxstage.internal.v1 import stage_pb2
from voxstage.stage.engine_loop import run_until_idle

INTERVAL_S = 0.05


def paced(by: str) -> float:
    return metrics.REGISTRY.get_sample_value("voxstage_talker_paced_steps_total", {"by": by}) or 0.0


def engine(
    model: Qwen3TTSTalker,
    tok: QwenTextTokenizer,
    interval: float,
    from_streams: int,
    ahead_s: float = 0.0,
    ride_s: float = 0.0,
) -> TalkerEngine:
    pacing = Pacing(min_step_interval_s=interval, ahead_s=ahead_s, ride_s=ride_s, from_streams=from_streams)
    cfg = EngineConfig(
        max_num_seqs=4, max_model_len=192, max_num_batched_tokens=128, async_scheduling=True, pacing=pacing
    )
    return TalkerEngine(Qwen3TTSAdapter(model, tok), cfg)


def run(
    eng: TalkerEngine, n: int, frames: int, max_wait: float = INTERVAL_S
) -> tuple[dict[str, list[TalkerOutput]], list[float]]:
    """All ``n`` requests at once, driven as the warm-up drives its request (``run_until_idle``: a step while
    there is work, else a sleep for ``idle_timeout``). Returns the outputs and the steps' launch times."""
    launches: list[float] = []
    launch = eng.adapter.launch

    def timed(*a: object, **k: object) -> object:
        launches.append(time.perf_counter())
        return launch(*a, **k)

    eng.adapter.launch = timed  # type: ignore[method-assign]
    for i in range(n):
        eng.submit(request(i, frames=frames))
    idle = eng.idle_timeout

    def checked() -> float | None:
        wait = idle()
        assert wait is None or 0 < wait <= max_wait
        return wait

    eng.idle_timeout = checked  # type: ignore[method-assign]
    out: dict[str, list[TalkerOutput]] = {}
    run_until_idle(eng, lambda outputs: [out.setdefault(o.request_id, []).append(o) for o in outputs])
    return out, launches


def test_steps_keep_the_pace_under_load_and_the_frames_are_the_same(
    tiny_custom_voice: Qwen3TTSTalker, tiny_tokenizer: QwenTextTokenizer
) -> None:
    paced_before = paced("interval")
    slow, launches = run(engine(tiny_custom_voice, tiny_tokenizer, INTERVAL_S, 3), 3, 6)
    free, _ = run(engine(tiny_custom_voice, tiny_tokenizer, 0.0, 3), 3, 6)
    assert set(slow) == set(free) == {"r0", "r1", "r2"}
    for rid in slow:
        assert np.array_equal(frames_of(slow[rid]), frames_of(free[rid])), rid
    gaps = np.diff(launches)
    assert len(launches) >= 6 and gaps.min() >= INTERVAL_S
    assert paced("interval") > paced_before


def test_below_the_load_threshold_nothing_waits(
    tiny_custom_voice: Qwen3TTSTalker, tiny_tokenizer: QwenTextTokenizer
) -> None:
    eng = engine(tiny_custom_voice, tiny_tokenizer, 10.0, 3)  # a 10 s pace, were it ever applied
    out, launches = run(eng, 2, 6)
    assert sorted(out) == ["r0", "r1"] and len(launches) >= 6
    assert eng.idle_timeout() is None and not eng.has_work()


def test_the_worker_warms_up_and_serves_with_every_step_paced(
    tiny_custom_voice: Qwen3TTSTalker, tiny_tokenizer: QwenTextTokenizer
) -> None:
    """``pace_from_streams: 1``: even a lone request waits for its pace, so ``has_work()`` is false between
    steps; the warm-up still runs its request to the end, and the engine thread wakes for each step."""
    eng = engine(tiny_custom_voice, tiny_tokenizer, INTERVAL_S, 1)
    worker = TalkerWorker(eng, INFO, TalkerDefaults.from_deploy(StageConfig(stage_id=0), INFO))
    outputs: list[TalkerOutput] = []

    class Listener:
        def __init__(self) -> None:
            self.done = asyncio.Event()

        def on_output(self, output: TalkerOutput) -> None:
            outputs.append(output)
            if output.finish is not None:
                self.done.set()

        def on_engine_failed(self, message: str) -> None:
            raise AssertionError(message)

        def on_request_failed(self, message: str) -> None:
            raise AssertionError(message)

    async def main() -> list[str]:
        fatal: list[str] = []
        worker.start(asyncio.get_running_loop(), fatal.append)
        await worker.warm_up(SpeechSpec(text="hello there", voice="ryan", language="english"))
        assert eng.slots_in_use() == 0 and not eng.has_work()
        listener = Listener()
        await worker.submit(request(0, frames=5), listener)
        await asyncio.wait_for(listener.done.wait(), 60)
        worker.stop()
        return fatal

    assert asyncio.run(main()) == []
    assert outputs[-1].finish is Finish.MAX_FRAMES and frames_of(outputs).shape[0] == 5


def test_streams_far_ahead_of_real_time_are_held(
    tiny_custom_voice: Qwen3TTSTalker, tiny_tokenizer: QwenTextTokenizer
) -> None:
    """``ahead_s`` 0.1 at 80 ms a frame: a stream's k-th frame launches no earlier than (k - 1) x 80 ms
    - 100 ms after its first was collected, so 8 frames take at least 0.46 s, and the frames do not change."""
    held_before = paced("ahead")
    eng = engine(tiny_custom_voice, tiny_tokenizer, 0.0, 2, ahead_s=0.1)
    t0 = time.perf_counter()
    out, launches = run(eng, 2, 8, max_wait=0.08)
    elapsed = time.perf_counter() - t0
    free, _ = run(engine(tiny_custom_voice, tiny_tokenizer, 0.0, 2), 2, 8)
    for rid in ("r0", "r1"):
        assert np.array_equal(frames_of(out[rid]), frames_of(free[rid])), rid
    assert elapsed >= 7 * 0.08 - 0.1 and paced("ahead") > held_before


def test_a_whole_clip_is_never_held(
    tiny_custom_voice: Qwen3TTSTalker, tiny_tokenizer: QwenTextTokenizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the clock stopped, a streamed request is held once it is ``ahead_s`` (0.2 s: after 3 frames)
    ahead of its first frame, while a whole clip (``TalkerRequest.whole_clip``) beside it runs to its end."""
    clock = [1000.0]
    monkeypatch.setattr(time, "perf_counter", lambda: clock[0])
    eng = engine(tiny_custom_voice, tiny_tokenizer, 0.0, 1, ahead_s=0.2)  # load from one request on
    whole = request(0, frames=8)
    whole.whole_clip = True
    eng.submit(whole)
    eng.submit(request(1, frames=8))
    out: dict[str, list[TalkerOutput]] = {}

    def until_idle() -> None:  # steps while there is work now (the clock stands still)
        for _ in range(200):
            if not eng.has_work():
                return
            for o in eng.step():
                out.setdefault(o.request_id, []).append(o)

    until_idle()
    assert out["r0"][-1].finish is Finish.MAX_FRAMES and frames_of(out["r0"]).shape[0] == 8
    assert frames_of(out["r1"]).shape[0] == 3 and out["r1"][-1].finish is None
    assert eng.idle_timeout() == pytest.approx(0.04)  # 3 x 80 ms - 0.2 s: then the next frame is due
    clock[0] += 1.0
    until_idle()
    assert out["r1"][-1].finish is Finish.MAX_FRAMES and frames_of(out["r1"]).shape[0] == 8


def test_the_opens_whole_clip_reaches_the_engine_request(
    tiny_custom_voice: Qwen3TTSTalker, tiny_tokenizer: QwenTextTokenizer
) -> None:
    eng = engine(tiny_custom_voice, tiny_tokenizer, 0.0, 1, ahead_s=1.0)
    worker = TalkerWorker(eng, INFO, TalkerDefaults.from_deploy(StageConfig(stage_id=0), INFO))
    for whole in (True, False):
        params = request_params(stage_pb2.StreamOpen(voice="ryan", whole_clip=whole))
        assert worker.build_request("k", params, "hello there", True).whole_clip is whole


def test_held_streams_ride_along_in_steps_that_run_anyway(
    tiny_custom_voice: Qwen3TTSTalker, tiny_tokenizer: QwenTextTokenizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A clock moved by hand, 20 ms a turn: r0 is held (``ahead_s`` 0.2 s) when r1 joins, 30 frames each.
    Held streams mask their rows, so each stream that comes due asks for a step of its own; with ``ride_s``
    a held stream steps in the steps its neighbour asks for anyway, the two fall into step and fewer steps
    run. The frames are the same as unpaced either way, and a stream never steps more than
    ``ahead_s + ride_s`` ahead of real time."""
    clock = [1000.0]
    monkeypatch.setattr(time, "perf_counter", lambda: clock[0])
    frames = 30

    def drive(ride_s: float) -> tuple[dict[str, list[TalkerOutput]], int]:
        eng = engine(tiny_custom_voice, tiny_tokenizer, 0.0, 1, ahead_s=0.2, ride_s=ride_s)
        steps = [0]
        launch = eng.adapter.launch

        def counted(active: list[bool], *a: object, **k: object) -> object:
            steps[0] += 1
            stepping = [s for s, on in zip(eng._slots, active, strict=False) if on and s.first_frame_at]
            leads = [s.launched * 0.08 - (clock[0] - s.first_frame_at) for s in stepping]
            assert all(lead <= 0.2 + ride_s + 1e-9 for lead in leads), leads
            return launch(active, *a, **k)

        eng.adapter.launch = counted  # type: ignore[method-assign]
        out: dict[str, list[TalkerOutput]] = {}
        eng.submit(request(0, frames=frames))
        for turn in range(400):
            if turn == 5:
                eng.submit(request(1, frames=frames))
            for _ in range(50):
                if not eng.has_work():
                    break
                for o in eng.step():
                    out.setdefault(o.request_id, []).append(o)
            if all(out.get(r) and out[r][-1].finish is not None for r in ("r0", "r1")):
                break
            clock[0] += 0.02
        return out, steps[0]

    held, held_steps = drive(0.0)
    riding, riding_steps = drive(0.5)
    free, _ = run(engine(tiny_custom_voice, tiny_tokenizer, 0.0, 2), 2, frames)
    for rid in ("r0", "r1"):
        assert np.array_equal(frames_of(riding[rid]), frames_of(free[rid])), rid
        assert np.array_equal(frames_of(held[rid]), frames_of(free[rid])), rid
    # Held, each stream's frames come due on their own (60 steps for 60 frames on this clock); riding,
    # most steps move both (39).
    assert riding_steps <= 0.75 * held_steps, (riding_steps, held_steps)
