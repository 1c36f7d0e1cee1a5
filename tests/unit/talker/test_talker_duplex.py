"""The duplex talker engine on the real PersonaPlex adapter (fixture weights): batched sessions equal their
solo runs whatever joins, leaves or arrives late; chunked prompt prefill; the gather rule; backlog drops."""

from __future__ import annotations

import numpy as np
import pytest

from services.talker.duplex.engine import (
    DuplexAdmissionError,
    DuplexConfig,
    DuplexEngine,
    DuplexRequest,
    Finish,
)
from services.talker.models.personaplex.adapter import PersonaPlexAdapter
from services.talker.models.personaplex.model import PersonaPlexLM
from services.talker.sampling import SamplingParams
from tests.golden_personaplex import fixture_model, load_case
from voxstage import metrics

TEXT = SamplingParams(temperature=0.7, top_k=25)
AUDIO = SamplingParams(temperature=0.8, top_k=250)


@pytest.fixture(scope="module")
def model() -> PersonaPlexLM:
    return fixture_model(load_case("prompt_voice"))


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def engine(
    model: PersonaPlexLM, slots: int = 4, budget: int = 512, clock: Clock | None = None
) -> DuplexEngine:
    cfg = DuplexConfig(max_sessions=slots, window=model.config.context, prefill_budget=budget)
    return DuplexEngine(PersonaPlexAdapter(model), cfg, clock=clock or Clock())


def request(i: int, persona_len: int = 3) -> DuplexRequest:
    rng = np.random.default_rng(i)
    codes = rng.integers(0, 2048, size=(4 + i, 8)) if i % 2 == 0 else None
    return DuplexRequest(f"s{i}", "", None, codes, seed=50 + i, text=TEXT, audio=AUDIO)


def user_frames(i: int, n: int) -> np.ndarray:
    return np.random.default_rng(100 + i).integers(0, 2048, size=(n, 8))


def run(eng: DuplexEngine, plan: dict[str, tuple[int, int]], ticks: int) -> dict[str, list[np.ndarray]]:
    """Sessions join at tick ``plan[id][0]`` and close at ``plan[id][1]``; each tick every decoding
    session gets its next user frame, then the engine steps until nothing is due."""
    out: dict[str, list[np.ndarray]] = {sid: [] for sid in plan}
    sent = dict.fromkeys(plan, 0)

    def step() -> None:
        for o in eng.step():
            if o.finish is None:
                out[o.session_id].append(o.tokens)

    for tick in range(ticks):
        for sid, (join, leave) in plan.items():
            if tick == join:
                eng.open(request(int(sid[1:])))
            if tick == leave:
                eng.close(sid)
        while any(eng.session_state(s) == "prefill" for s in plan):
            step()  # prefill (several ticks' worth, if the budget is small), then the prompt's own step
        for sid, (join, leave) in plan.items():
            if join <= tick < leave and eng.session_state(sid) == "decode":
                frames = user_frames(int(sid[1:]), 200)
                eng.push_user(sid, sent[sid], frames[sent[sid] : sent[sid] + 1])
                sent[sid] += 1
        while eng.has_work():
            step()
    return out


def test_batched_sessions_equal_their_solo_runs(model: PersonaPlexLM) -> None:
    plan = {"s0": (0, 14), "s1": (2, 9), "s2": (3, 16), "s3": (5, 12)}
    together = run(engine(model), plan, ticks=18)
    for sid, (join, leave) in plan.items():
        alone = run(engine(model, slots=1), {sid: (0, leave - join)}, ticks=leave - join + 1)
        # The prompt's frame, then one per tick; a joiner's first live frame may wait a tick for the others'.
        assert len(alone[sid]) == leave - join + 1 and len(together[sid]) >= leave - join
        n = len(together[sid])
        np.testing.assert_array_equal(np.stack(together[sid]), np.stack(alone[sid][:n]), err_msg=sid)


def test_prefill_is_chunked_under_the_budget(model: PersonaPlexLM) -> None:
    eng = engine(model, budget=5)
    eng.open(request(0))
    length = eng._by_id["s0"].prefill_target
    steps = 0
    while eng.session_state("s0") == "prefill":
        eng.step()
        steps += 1
    assert steps == -(-length // 5)
    small = run(engine(model, budget=5), {"s0": (0, 6)}, ticks=7)
    large = run(engine(model), {"s0": (0, 6)}, ticks=7)
    np.testing.assert_array_equal(np.stack(small["s0"]), np.stack(large["s0"]))


def test_a_burst_of_joins_shares_its_prefill_calls(model: PersonaPlexLM) -> None:
    """Sessions joining in one tick are prefilled together up to the shortest prompt (s1 and s3 have no
    voice), then the longer rest together (s0's voice is shorter than s2's), and speak as they would alone."""
    plan = {"s0": (0, 8), "s1": (0, 8), "s2": (0, 8), "s3": (0, 8)}
    eng = engine(model)
    calls: list[list[tuple[int, int, int]]] = []
    real = eng.adapter.prefill_many

    def counting(chunks: list) -> None:
        calls.append([(slot, start, n) for slot, _, start, n in chunks])
        real(chunks)

    eng.adapter.prefill_many = counting  # type: ignore[method-assign]
    together = run(eng, plan, ticks=9)
    assert [sorted(slot for slot, _, _ in call) for call in calls] == [[0, 1, 2, 3], [0, 2], [2]]
    assert all(len({(start, n) for _, start, n in call}) == 1 for call in calls)  # one offset per call
    for sid, (join, leave) in plan.items():
        alone = run(engine(model, slots=1), {sid: (0, leave - join)}, ticks=leave - join + 1)
        n = len(together[sid])
        assert n >= leave - join
        np.testing.assert_array_equal(np.stack(together[sid]), np.stack(alone[sid][:n]), err_msg=sid)


def test_steps_wait_for_every_session_or_the_gather_deadline(model: PersonaPlexLM) -> None:
    clock = Clock()
    eng = engine(model, clock=clock)
    count, total = (
        metrics.REGISTRY.get_sample_value(f"voxstage_duplex_prefill_wait_seconds_{k}") or 0
        for k in ("count", "sum")
    )
    for i in range(2):
        eng.open(request(i))
    clock.now += 0.03  # the prompts' prefill starts 30 ms after admission
    while eng.has_work():
        eng.step()  # prefill, then each session's prompt step (it needs no user frame)
    # Each session's wait from admission to its first step is observed once (talker's part of first audio).
    assert metrics.REGISTRY.get_sample_value("voxstage_duplex_prefill_wait_seconds_count") == count + 2
    got = metrics.REGISTRY.get_sample_value("voxstage_duplex_prefill_wait_seconds_sum") - total
    assert got == pytest.approx(2 * 0.03)
    steps = eng.steps
    eng.push_user("s0", 0, user_frames(0, 1))
    assert not eng.has_work()  # s1's frame is missing: wait
    assert eng.idle_timeout() == pytest.approx(eng.cfg.gather_s)
    clock.now += eng.cfg.gather_s
    assert eng.has_work()
    outs = eng.step()
    assert [o.session_id for o in outs] == ["s0"] and eng.steps == steps + 1
    eng.push_user("s1", 0, user_frames(1, 1))
    eng.push_user("s0", 1, user_frames(0, 2)[1:])
    assert eng.has_work()
    assert sorted(o.session_id for o in eng.step()) == ["s0", "s1"]


def test_a_lagging_queue_drops_its_oldest_frames(model: PersonaPlexLM) -> None:
    eng = engine(model)
    eng.open(request(1))
    while eng.has_work():
        eng.step()
    eng.push_user("s1", 0, user_frames(1, 5))
    (out,) = eng.step()
    assert out.user_frame == 3 and out.consumed == 4  # 5 queued: 3 dropped, frame 3 used, frame 4 stays
    assert eng.dropped_frames == 3
    with pytest.raises(ValueError, match="expected frame 5"):
        eng.push_user("s1", 7, user_frames(1, 1))


def test_admission_close_and_cancel(model: PersonaPlexLM) -> None:
    eng = engine(model, slots=2)
    eng.open(request(0))
    eng.open(request(1))
    with pytest.raises(DuplexAdmissionError):
        eng.open(request(2))
    with pytest.raises(ValueError, match="already open"):
        eng.open(request(0))
    eng.cancel("s0")
    eng.close("s1")
    finishes = {o.session_id: o.finish for o in eng.step()}
    assert finishes == {"s0": Finish.CANCELLED, "s1": Finish.CLOSED}
    assert eng.sessions() == 0
    eng.open(request(2))  # slots are free again
    with pytest.raises(KeyError):
        eng.push_user("s0", 0, user_frames(0, 1))


def test_the_first_output_is_the_prompts_last_frame(model: PersonaPlexLM) -> None:
    eng = engine(model)
    eng.open(request(0))
    while eng.has_work():
        outs = eng.step()
    (first,) = outs
    assert first.frame == 0 and first.user_frame == -1 and first.consumed == 0
    silence = (948, 243, 1178, 546, 1736, 1030, 1978, 2008)
    assert first.tokens[0] == 3 and tuple(first.tokens[1:]) == silence  # PAD text, silence codes


def test_a_step_does_not_prefill_a_sliver_of_a_prompt_to_use_up_its_budget(model: PersonaPlexLM) -> None:
    """Two whole prompts fit a step's budget and a third does not: the third waits for the next step whole
    (a launch-bound call of a few positions would delay the live sessions as a full one does), while a prompt
    longer than the whole budget is still split into budget-sized chunks."""
    probe = engine(model)
    probe.open(request(1))
    target = probe._by_id["s1"].prefill_target
    eng = engine(model, budget=2 * target + target // 2)
    calls: list[list[tuple[int, int]]] = []
    real = eng.adapter.prefill_many

    def counting(chunks: list) -> None:
        calls.append([(start, n) for _, _, start, n in chunks])
        real(chunks)

    eng.adapter.prefill_many = counting  # type: ignore[method-assign]
    for i in (1, 3, 5):
        eng.open(request(i))
    eng.step()
    assert calls == [[(0, target), (0, target)]]
    eng.step()
    assert calls[1:] == [[(0, target)]]
    small = engine(model, budget=target // 3)
    small.open(request(1))
    steps = 0
    while small.session_state("s1") == "prefill":
        small.step()
        steps += 1
    assert steps == -(-target // (target // 3))
