"""The per-frame step and the reference generation loop: batch invariance, chunked prefill, seeded
sampling, c0 rules (suppression, min frames, presence penalty) and streamed text with starvation."""

from __future__ import annotations

import copy
from collections.abc import Callable

import pytest
import torch

from services.talker.models.qwen3_tts.frame import FrameState, frame_step
from services.talker.models.qwen3_tts.generate import TalkerRequest, generate
from services.talker.models.qwen3_tts.model import Qwen3TTSTalker
from services.talker.models.qwen3_tts.prompt import PromptSpec, build_prompt
from services.talker.sampling import SamplingParams

ModelFactory = Callable[[str], Qwen3TTSTalker]
ROLE = [151644, 300, 198]
TEXT = [1000 + 7 * i for i in range(12)]
SAMPLED = SamplingParams(temperature=0.9, top_k=50, repetition_penalty=1.05)
SUB = SamplingParams(temperature=0.9, top_k=50)


def request(
    m: Qwen3TTSTalker, frames: int, seed: int = 0, sampled: bool = False, **spec: object
) -> TalkerRequest:
    args: dict = {"role_ids": ROLE, "text_ids": TEXT, "language": "english", "speaker": "ryan", **spec}
    prompt = build_prompt(m, PromptSpec(**args))
    if sampled:
        return TalkerRequest(prompt, seed=seed, talker=SAMPLED, subtalker=SUB, max_new_frames=frames)
    greedy = SamplingParams(do_sample=False, repetition_penalty=1.05)
    return TalkerRequest(prompt, seed=seed, talker=greedy, max_new_frames=frames)


def test_batched_and_chunked_runs_equal_alone(tiny_model: ModelFactory) -> None:
    m = tiny_model("custom_voice")
    reqs = [
        request(m, 5, seed=1, sampled=True),
        request(m, 4, speaker="eric", language="auto", non_streaming=True),
        request(m, 5, seed=3, sampled=True, text_ids=TEXT[:4], speaker="vivian"),
    ]
    alone = [generate(m, [r])[0] for r in reqs]
    together = generate(m, reqs, prefill_chunk=5)
    for a, b in zip(alone, together, strict=True):
        assert a.codes.shape == (a.codes.shape[0], 16) and a.codes.shape[0] > 0
        assert torch.equal(a.codes, b.codes)
        assert a.c0 == b.c0
    assert not torch.equal(alone[0].codes[:4], alone[1].codes[:4])


def test_seed_controls_sampling(tiny_model: ModelFactory) -> None:
    m = tiny_model("custom_voice")
    first = generate(m, [request(m, 4, seed=11, sampled=True)])[0]
    again = generate(m, [request(m, 4, seed=11, sampled=True)])[0]
    other = generate(m, [request(m, 4, seed=12, sampled=True)])[0]
    assert torch.equal(first.codes, again.codes)
    assert not torch.equal(first.codes, other.codes)
    assert int(first.codes[:, 1:].max()) < 2048 and int(first.codes[:, 0].max()) < 2048


def test_streamed_text_equals_whole_text(tiny_model: ModelFactory) -> None:
    m = tiny_model("custom_voice")
    text = TEXT[:8]
    whole = generate(m, [request(m, 10, seed=5, sampled=True, text_ids=text)])[0]
    # Start with 2 tokens; deliver the rest in pieces, late (the slot must wait, not read pad meanwhile).
    schedule = {1: (text[2:4], False), 3: (text[4:7], False), 6: (text[7:], True)}
    calls: list[int] = []

    def source(_index: int, frames: int) -> tuple[list[int], bool] | None:
        calls.append(frames)
        if frames in schedule and calls.count(frames) == 2:  # arrives one tick after it was needed
            return schedule.pop(frames)
        return None

    streamed_req = request(m, 10, seed=5, sampled=True, text_ids=text[:2], text_complete=False)
    streamed = generate(m, [streamed_req], text_source=source)[0]
    assert torch.equal(streamed.codes, whole.codes)
    assert streamed.starved_frames > 0


def test_starved_request_without_more_text_is_reported(tiny_model: ModelFactory) -> None:
    m = tiny_model("custom_voice")
    req = request(m, 10, text_ids=TEXT[:2], text_complete=False)
    with pytest.raises(RuntimeError, match="input-starved"):
        generate(m, [req], text_source=lambda _i, _f: None, max_idle_ticks=5)


@pytest.fixture(scope="module")
def scripted(tiny_model: ModelFactory) -> Qwen3TTSTalker:
    """A copy whose codec head reads only hidden[0]: logits are set per code by that one coordinate."""
    m = copy.deepcopy(tiny_model("custom_voice"))
    with torch.no_grad():
        m.codec_head.weight.zero_()
    return m


def _steps(m: Qwen3TTSTalker, frames: int, min_new: int = 2, penalty: float = 1.05) -> list[int]:
    state = FrameState.allocate(m, 2, 8)
    greedy = SamplingParams(do_sample=False, repetition_penalty=penalty)
    state.reset_slot(
        1,
        seed=0,
        talker=greedy,
        subtalker=greedy,
        trailing_ids=[5],
        text_complete=True,
        min_new_tokens=min_new,
    )
    cache = m.allocate_predictor_cache(1)
    hidden = torch.zeros(1, m.hidden_size)
    hidden[0, 0] = 1.0
    out = []
    for _ in range(frames):
        with torch.no_grad():
            out.append(int(frame_step(m, hidden, torch.tensor([1]), state, cache).codes[0, 0]))
    return out


def test_eos_waits_for_min_frames_and_specials_are_suppressed(scripted: Qwen3TTSTalker) -> None:
    with torch.no_grad():
        scripted.codec_head.weight.zero_()
        scripted.codec_head.weight[2150, 0] = 5.0  # EOS
        scripted.codec_head.weight[2100, 0] = 9.0  # a suppressed special
        scripted.codec_head.weight[17, 0] = 1.0
    assert _steps(scripted, 4) == [17, 17, 2150, 2150]
    assert _steps(scripted, 4, min_new=0)[0] == 2150


def test_repetition_penalty_uses_presence_not_counts(scripted: Qwen3TTSTalker) -> None:
    with torch.no_grad():
        scripted.codec_head.weight.zero_()
        scripted.codec_head.weight[40, 0] = 1.0
        scripted.codec_head.weight[41, 0] = 0.99
    # 40, then 41 (1/1.05 < 0.99), then 40 again: with count-based penalties the third would be 41.
    assert _steps(scripted, 3) == [40, 41, 40]
    assert _steps(scripted, 3, penalty=1.0) == [40, 40, 40]


def test_frame_step_flags_starved_rows_and_uses_pad_after_text(tiny_model: ModelFactory) -> None:
    m = tiny_model("custom_voice")
    state = FrameState.allocate(m, 2, 8)
    greedy = SamplingParams(do_sample=False)
    state.reset_slot(0, seed=0, talker=greedy, subtalker=greedy, trailing_ids=[9], text_complete=False)
    state.reset_slot(1, seed=0, talker=greedy, subtalker=greedy, trailing_ids=[9, 151673], text_complete=True)
    cache = m.allocate_predictor_cache(2)
    hidden = torch.randn(2, m.hidden_size)
    rows = torch.tensor([0, 1])
    with torch.no_grad():
        first = frame_step(m, hidden, rows, state, cache)
        assert first.starved.tolist() == [False, False]
        second = frame_step(m, hidden, rows, state, cache)
        assert second.starved.tolist() == [True, False]
        third = frame_step(m, hidden, rows, state, cache)
        # Row 1 is past its queue (text complete): its next input carries tts_pad.
        pad = m.embed_text(torch.tensor([151671]))[0]
        torch.testing.assert_close(third.next_embed[1], m.embed_frame(third.codes[1]) + pad)
    assert state.frames.tolist() == [3, 3]
    assert bool(state.seen_c0[0, first.codes[0, 0]])
