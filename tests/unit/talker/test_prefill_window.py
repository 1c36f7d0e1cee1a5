"""A joining session's prefill runs in the tick's gap (services.talker.duplex.window): the rule alone, and on
the duplex engine with the real PersonaPlex adapter (fixture weights) whose calls take clock time."""

from __future__ import annotations

import numpy as np
import pytest

from services.talker.duplex.engine import DuplexConfig, DuplexEngine, DuplexRequest
from services.talker.duplex.window import PrefillWindow
from services.talker.models.personaplex.adapter import PersonaPlexAdapter
from services.talker.sampling import SamplingParams
from tests.golden_personaplex import fixture_model, load_case

TICK = 0.08


def window() -> PrefillWindow:
    return PrefillWindow(TICK, after_step_s=0.012, before_tick_s=0.006, call_s=0.020)


def test_with_no_live_session_calls_run_back_to_back() -> None:
    w = window()
    assert w.may_call(0.0, live=False)
    w.user_frames(0.0)
    w.stepped(0.005)
    assert w.may_call(0.006, live=False)  # nobody to delay


def test_a_call_waits_for_the_codec_after_a_step_and_must_end_before_the_next_tick() -> None:
    w = window()
    w.user_frames(1.000)
    w.stepped(1.020)
    assert not w.may_call(1.025, live=True)  # the codec decodes the step's frames
    assert w.opens_in(1.025, live=True) == pytest.approx(0.007)
    assert w.may_call(1.032, live=True)
    w.called(0.020)
    # The next tick's frames are due at 1.080; a 20 ms call must end 6 ms before them.
    assert w.may_call(1.054, live=True)
    assert not w.may_call(1.055, live=True)
    assert w.opens_in(1.055, live=True) == pytest.approx(1.120 - 1.055)  # only a missing tick reopens it
    # The tick's frames arrive: nothing runs before its step, however late in the window.
    w.user_frames(1.080)
    assert not w.may_call(1.085, live=True)
    w.stepped(1.100)
    assert w.may_call(1.112, live=True)


def test_one_call_per_tick_runs_whatever_its_fit() -> None:
    w = PrefillWindow(TICK, after_step_s=0.012, before_tick_s=0.006, call_s=0.070)
    w.user_frames(0.0)
    w.stepped(0.030)
    assert w.may_call(0.042, live=True)  # 70 ms does not fit; joins still progress
    w.called(0.070)
    assert not w.may_call(0.043, live=True)


def test_a_tick_that_does_not_come_holds_nothing() -> None:
    w = window()
    w.user_frames(0.0)
    w.stepped(0.020)
    w.called(0.020)
    assert not w.may_call(0.070, live=True)
    assert w.may_call(0.121, live=True)  # half a tick past the frames' time


def test_a_burst_of_pushes_is_one_tick_and_calls_are_averaged() -> None:
    w = window()
    w.user_frames(1.000)
    w.user_frames(1.003)  # the rest of the tick's sessions
    w.stepped(1.010)
    w.called(0.040)
    assert w.call_s == pytest.approx(0.7 * 0.020 + 0.3 * 0.040)
    # Next tick expected at 1.080 (the burst's first push), not 1.083.
    assert w.may_call(1.080 - 0.006 - w.call_s, live=True)
    assert not w.may_call(1.080 - 0.006 - w.call_s + 0.001, live=True)


# -- on the engine ----------------------------------------------------------------------------------------

TEXT = SamplingParams(temperature=0.7, top_k=25)
AUDIO = SamplingParams(temperature=0.8, top_k=250)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def request(i: int) -> DuplexRequest:
    return DuplexRequest(f"s{i}", "", None, None, seed=50 + i, text=TEXT, audio=AUDIO)


def frame(i: int) -> np.ndarray:
    return np.random.default_rng(i).integers(0, 2048, size=(1, 8))


@pytest.fixture(scope="module")
def model():  # noqa: ANN201 - the fixture model's class is the family's
    return fixture_model(load_case("prompt_voice"))


def test_joins_prefill_in_the_gap_and_never_ahead_of_a_due_step(model) -> None:  # noqa: ANN001
    clock = Clock()
    probe = DuplexEngine(PersonaPlexAdapter(model), DuplexConfig(1, model.config.context, 512), clock=clock)
    probe.open(request(1))
    target = probe._by_id["s1"].prefill_target
    # A budget of a third of a prompt: each joiner needs three calls, each call takes 30 ms of the clock.
    cfg = DuplexConfig(max_sessions=3, window=model.config.context, prefill_budget=target // 3 + 1)
    eng = DuplexEngine(PersonaPlexAdapter(model), cfg, clock=clock)
    events: list[str] = []
    real_prefill, real_step = eng.adapter.prefill_many, eng.adapter.step

    def prefill(chunks: list) -> None:
        events.append("prefill")
        real_prefill(chunks)
        clock.now += 0.030

    def step(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        events.append("step")
        return real_step(*args, **kwargs)

    eng.adapter.prefill_many = prefill  # type: ignore[method-assign]
    eng.adapter.step = step  # type: ignore[method-assign]
    eng.open(request(0))
    while eng.has_work():
        eng.step()  # s0 alone: its calls run back to back, then its first step
    assert events == ["prefill"] * 3 + ["step"]
    events.clear()
    eng.open(request(2))  # s2 joins while s0 is live
    clock.now = 1.0
    eng.push_user("s0", 0, frame(0))
    assert eng.has_work()
    eng.step()
    assert events[0] == "step"  # the due step goes before any call
    clock.now = 1.013
    while eng.has_work():
        eng.step()
    # The gap: 1.013 -> one call (to 1.043); the next would end at 1.043 + ~0.028 <= 1.074 -> a second one
    # (to 1.073); a third would not end before the frames at 1.080 - 6 ms.
    assert events == ["step", "prefill", "prefill"]
    assert not eng.has_work() and eng.idle_timeout() == pytest.approx(1.120 - clock.now)
    clock.now = 1.080
    eng.push_user("s0", 1, frame(1))
    eng.step()
    assert events[3] == "step"  # s0's frame goes first, then the last call of s2's prompt in the gap
    clock.now = 1.100
    while eng.has_work():
        eng.step()
    assert events[4:] == ["prefill"] and eng.session_state("s2") == "decode"


def test_frames_that_came_during_the_prefill_are_dropped_with_the_first_step(model) -> None:  # noqa: ANN001
    clock = Clock()
    cfg = DuplexConfig(max_sessions=2, window=model.config.context, prefill_budget=512)
    eng = DuplexEngine(PersonaPlexAdapter(model), cfg, clock=clock)
    eng.open(request(0))
    eng.push_user("s0", 0, np.concatenate([frame(0), frame(1)]))  # the codec's ticks during the join
    clock.now = 0.02
    (first,) = eng.step()
    assert first.user_frame == -1 and first.consumed == 2 and eng.dropped_frames == 2
    clock.now = 0.08
    eng.push_user("s0", 2, frame(2))
    (nxt,) = eng.step()
    assert nxt.user_frame == 2 and nxt.consumed == 1  # in step with the codec's ticks, no catch-up step
