"""PersonaPlex sessions batched in one frame step: each session's tokens equal its solo run, whatever joins,
leaves or sits out around it (seeded sampling included)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
import torch

from services.talker.models.personaplex.adapter import PersonaPlexAdapter, bucket
from services.talker.models.personaplex.model import PersonaPlexLM
from services.talker.models.personaplex.prompt import Prompt, build_prompt
from services.talker.models.personaplex.voices import voice_from_codes
from services.talker.sampling import SamplingParams
from tests.golden_personaplex import fixture_model, load_case

TEXT = SamplingParams(temperature=0.7, top_k=25)
AUDIO = SamplingParams(temperature=0.8, top_k=250)


@pytest.fixture(scope="module")
def model() -> PersonaPlexLM:
    return fixture_model(load_case("prompt_voice"))


@dataclass
class Session:
    name: str
    prompt: Prompt
    users: np.ndarray  # [steps, 8]: the user frame of each free step after the first
    seed: int
    join: int  # tick it joins at
    leave: int  # tick it leaves at (exclusive)
    sampling: tuple[SamplingParams, SamplingParams] = (TEXT, AUDIO)


def drive(adapter: PersonaPlexAdapter, sessions: list[Session], ticks: int) -> dict[str, list[np.ndarray]]:
    """A minimal engine: packed slots, join (whole prefill) and leave between ticks, one frame per tick."""
    slots: list[Session] = []
    made: dict[str, list[np.ndarray]] = {s.name: [] for s in sessions}
    done: dict[str, int] = {s.name: 0 for s in sessions}
    for tick in range(ticks):
        for s in [s for s in slots if s.leave == tick]:
            hole, last = slots.index(s), len(slots) - 1
            if hole != last:
                adapter.move_slot(last, hole, int(adapter.state.steps[last]))
                slots[hole] = slots[last]
            slots.pop()
        for s in sessions:
            if s.join == tick:
                slot = len(slots)
                slots.append(s)
                adapter.admit(slot, seed=s.seed, text=s.sampling[0], audio=s.sampling[1])
                adapter.prefill(slot, s.prompt, 0, s.prompt.length - 1)
                adapter.start_decode(slot, s.prompt)
        if not slots:
            continue
        feeding = [i for i, s in enumerate(slots) if done[s.name] > 0]
        frames = np.stack([slots[i].users[done[slots[i].name] - 1] for i in feeding]) if feeding else None
        if frames is not None:
            adapter.set_user(feeding, frames)
        adapter.step([True] * len(slots), int(adapter.state.steps[: len(slots)].max()))
        for i, s in enumerate(slots):
            made[s.name].append(adapter.state.column[i, :9].cpu().numpy().copy())
            done[s.name] += 1
    return made


def _sessions(model: PersonaPlexLM) -> list[Session]:
    rng = np.random.default_rng(5)
    cfg = model.config
    out = []
    for i in range(4):
        codes = rng.integers(0, 2048, size=(3 + 2 * i, 8)) if i % 2 == 0 else None
        text = [int(t) for t in rng.integers(4, cfg.text_card, size=2 + i)]
        prompt = build_prompt(cfg, voice_codes=codes, text_ids=text)
        users = rng.integers(0, 2048, size=(40, 8))
        out.append(Session(f"s{i}", prompt, users, seed=100 + i, join=2 * i, leave=10 + 3 * i))
    out[3].sampling = (SamplingParams(do_sample=False), SamplingParams(temperature=1.2, top_k=0))
    return out


def test_batched_sessions_equal_their_solo_runs(model: PersonaPlexLM) -> None:
    sessions = _sessions(model)
    together = PersonaPlexAdapter(model)
    together.allocate(4, model.config.context)
    batched = drive(together, sessions, ticks=20)
    for s in sessions:
        alone = PersonaPlexAdapter(model)
        alone.allocate(1, model.config.context)
        solo = Session(s.name, s.prompt, s.users, s.seed, join=0, leave=s.leave - s.join, sampling=s.sampling)
        expected = drive(alone, [solo], ticks=s.leave - s.join)
        assert len(batched[s.name]) == len(expected[s.name]) >= 8
        np.testing.assert_array_equal(np.stack(batched[s.name]), np.stack(expected[s.name]), err_msg=s.name)


def test_sampling_differs_by_seed_and_is_reproducible(model: PersonaPlexLM) -> None:
    base = _sessions(model)[0]
    runs = []
    for seed in (1, 1, 2):
        adapter = PersonaPlexAdapter(model)
        adapter.allocate(1, model.config.context)
        s = Session("x", base.prompt, base.users, seed, join=0, leave=12)
        runs.append(np.stack(drive(adapter, [s], ticks=12)["x"]))
    np.testing.assert_array_equal(runs[0], runs[1])
    assert (runs[0] != runs[2]).any()


def test_an_inactive_row_keeps_its_state(model: PersonaPlexLM) -> None:
    sessions = _sessions(model)[:2]
    adapter = PersonaPlexAdapter(model)
    adapter.allocate(2, model.config.context)
    for slot, s in enumerate(sessions):
        adapter.admit(slot, seed=s.seed, text=TEXT, audio=AUDIO)
        adapter.prefill(slot, s.prompt, 0, s.prompt.length - 1)
        adapter.start_decode(slot, s.prompt)
    before = {k: getattr(adapter.state, k)[1].clone() for k in ("column", "steps", "force", "user")}
    k_before = adapter.kv.k[:, 1, :, : int(adapter.state.steps[1])].clone()
    _, valid = adapter.step([True, False], int(adapter.state.steps[:2].max()))
    # The first free step outputs the prompt's last frame (moshi's step t >= 1 returns frame t-1);
    # row 1 sat out.
    assert valid.tolist() == [True, False]
    for key, value in before.items():
        torch.testing.assert_close(getattr(adapter.state, key)[1], value, rtol=0, atol=0)
    torch.testing.assert_close(adapter.kv.k[:, 1, :, : k_before.shape[2]], k_before, rtol=0, atol=0)
    assert int(adapter.state.steps[0]) == sessions[0].prompt.length


def test_stored_voice_made_from_codes_replays_exactly(model: PersonaPlexLM) -> None:
    rng = np.random.default_rng(9)
    codes = rng.integers(0, 2048, size=(6, 8))
    text = [5, 6, 7]
    by_codes = build_prompt(model.config, voice_codes=codes, text_ids=text)
    by_voice = build_prompt(model.config, voice=voice_from_codes(model, codes), text_ids=text)
    assert by_voice.length == by_codes.length and by_voice.num_embedded == len(codes) - 1
    np.testing.assert_array_equal(by_voice.columns, by_codes.columns[by_voice.num_embedded :])
    users = rng.integers(0, 2048, size=(10, 8))
    results = []
    for prompt in (by_codes, by_voice):
        adapter = PersonaPlexAdapter(model)
        adapter.allocate(1, model.config.context)
        results.append(np.stack(drive(adapter, [Session("v", prompt, users, 3, 0, 8)], ticks=8)["v"]))
    np.testing.assert_array_equal(results[0], results[1])


def test_buckets_and_window_checks(model: PersonaPlexLM) -> None:
    assert [bucket(n, 48) for n in (1, 2, 3, 33, 48)] == [1, 2, 4, 48, 48]
    adapter = PersonaPlexAdapter(model)
    with pytest.raises(ValueError, match="window"):
        adapter.allocate(1, model.config.context + 1)
    adapter.allocate(1, 20)
    assert adapter.attn_bucket(5) == 20 and adapter.attn_bucket(500) == 20
    long_prompt = build_prompt(model.config, text_ids=list(range(4, 20)))
    with pytest.raises(ValueError, match="does not fit"):
        adapter.prefill(0, long_prompt, 0, 5)
