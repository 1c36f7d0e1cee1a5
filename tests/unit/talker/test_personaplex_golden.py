"""Golden parity of the PersonaPlex LM with the reference moshi 0.2.13 ``LMGen.step`` (fixtures from
``tests/golden_builders/make_golden_personaplex.py``): greedy token streams, prompt columns, ring wrap, stored
voices."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from services.talker.models.personaplex.adapter import PersonaPlexAdapter
from services.talker.models.personaplex.prompt import Prompt, VoiceEmbeddings, build_prompt
from services.talker.sampling import SamplingParams
from tests.golden_personaplex import fixture_model, load_case

GREEDY = SamplingParams(do_sample=False)
CASES = ("prompt_voice", "ring_window")


@pytest.fixture(scope="module", params=CASES)
def case(request: pytest.FixtureRequest) -> dict[str, Any]:
    return load_case(request.param)


def _prompt(case: dict[str, Any], model: Any, stored_voice: bool = False) -> Prompt:
    if stored_voice:
        voice = VoiceEmbeddings(torch.from_numpy(case["voice_embeddings"]), case["voice_cache"])
        return build_prompt(model.config, voice=voice, text_ids=case["text_ids"])
    return build_prompt(model.config, voice_codes=case.get("voice"), text_ids=case["text_ids"])


def run_session(
    adapter: PersonaPlexAdapter, prompt: Prompt, users: np.ndarray, first: int, chunk: int | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Prefill ``prompt`` into slot 0, then step it with ``users[s]`` for s >= ``first``. Returns, per free
    step, the input column, the 9 tokens made for the next column, and moshi's output frame with its flag."""
    adapter.admit(0, seed=7, text=GREEDY, audio=GREEDY)
    positions = prompt.length - 1
    chunk = chunk or positions
    for start in range(0, positions, chunk):
        adapter.prefill(0, prompt, start, min(chunk, positions - start))
    adapter.start_decode(0, prompt)
    inputs, made, out, valid = [], [], [], []
    for s in range(first, len(users)):
        if s > first:  # the first free step's user frame belongs to the prompt
            adapter.set_user([0], users[s][None])
        column = adapter.state.column[0].clone()
        column[9] = adapter.state.user[0, 0]
        inputs.append(column.cpu().numpy().copy())
        tokens, ok = adapter.step([True], int(adapter.state.steps[0]), all_greedy=True)
        made.append(adapter.state.column[0, :9].cpu().numpy().copy())
        out.append(tokens[0])
        valid.append(ok[0])
    return np.stack(inputs), np.stack(made), np.stack(out), np.asarray(valid)


def test_prompt_columns_equal_the_reference_inputs(case: dict[str, Any]) -> None:
    model = fixture_model(case)
    prompt = _prompt(case, model)
    m = case["prompt_frames"]
    assert prompt.length == m
    np.testing.assert_array_equal(prompt.columns, case["inputs"][:m])


def test_greedy_stream_equals_moshi_for_every_free_step(case: dict[str, Any]) -> None:
    model = fixture_model(case)
    adapter = PersonaPlexAdapter(model)
    adapter.allocate(2, model.config.context)
    m = case["prompt_frames"]
    inputs, made, out, valid = run_session(adapter, _prompt(case, model), case["user"], m - 1)
    assert len(made) >= 50
    np.testing.assert_array_equal(inputs, case["inputs"][m - 1 :])  # 17 rows in, text included
    np.testing.assert_array_equal(made, case["made"][m - 1 :])  # text + 8 agent codebooks out
    # What moshi's step returns: frame t-1 = text and codebook 0 of column t, codebooks 1..7 of column t+1.
    np.testing.assert_array_equal(out[:, :2], case["inputs"][m - 1 :, :2])
    np.testing.assert_array_equal(out[:, 2:], case["made"][m - 1 :, 2:9])
    assert valid.all()


def test_ring_window_wraps_and_keeps_going() -> None:
    case = load_case("ring_window")
    window = case["lm_kwargs"]["context"]
    total = case["prompt_frames"] - 1 + case["free_steps"]
    assert total > 3 * window  # the fixture's session slid its window three times, matching moshi above


def test_stored_voice_replays_to_the_same_stream() -> None:
    case = load_case("prompt_voice")
    model = fixture_model(case)
    adapter = PersonaPlexAdapter(model)
    adapter.allocate(1, model.config.context)
    prompt = _prompt(case, model, stored_voice=True)
    assert prompt.num_embedded == len(case["voice"]) - 1
    m = case["prompt_frames"]
    _, made, _, _ = run_session(adapter, prompt, case["user"], m - 1)
    np.testing.assert_array_equal(made, case["made"][m - 1 :])


@pytest.mark.parametrize("chunk", [1, 7])
def test_chunked_prefill_gives_the_same_stream(chunk: int) -> None:
    case = load_case("prompt_voice")
    model = fixture_model(case)
    adapter = PersonaPlexAdapter(model)
    adapter.allocate(1, model.config.context)
    m = case["prompt_frames"]
    _, made, _, _ = run_session(adapter, _prompt(case, model), case["user"][: m + 20], m - 1, chunk=chunk)
    np.testing.assert_array_equal(made, case["made"][m - 1 : m + 20])


def test_a_wrong_token_changes_the_stream() -> None:
    """The comparison can fail: one different user code moves the stream away from the reference."""
    case = load_case("prompt_voice")
    model = fixture_model(case)
    adapter = PersonaPlexAdapter(model)
    adapter.allocate(1, model.config.context)
    m = case["prompt_frames"]
    users = case["user"].copy()
    users[m + 2, 0] = (users[m + 2, 0] + 1) % 2048
    _, made, _, _ = run_session(adapter, _prompt(case, model), users, m - 1)
    assert (made != case["made"][m - 1 :]).any()
