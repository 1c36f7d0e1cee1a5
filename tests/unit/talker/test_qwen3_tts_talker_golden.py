"""Golden parity with the reference qwen-tts 0.1.1 (fixtures from
tests/golden_builders/make_golden_qwen3_tts.py).

Each variant's tiny checkpoint is materialized in the released on-disk layout and loaded through the real
loader; prompts are rebuilt from the recorded token ids; prefill embeddings and logits must match within
the recorded tolerances and greedy generation must give identical 16-code frames, both from the plain
``generate`` loop and from the serving path (``TalkerEngine`` over ``Qwen3TTSAdapter.decode_core``, the unit
the stage captures as a CUDA graph).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from services.talker.engine import EngineConfig, Finish, TalkerEngine
from services.talker.engine import TalkerRequest as EngineRequest
from services.talker.models.qwen3_tts.adapter import Qwen3TTSAdapter, QwenPrepared
from services.talker.models.qwen3_tts.generate import TalkerRequest, TalkerResult, generate, prefill
from services.talker.models.qwen3_tts.loader import load_qwen3_tts_talker
from services.talker.models.qwen3_tts.model import Qwen3TTSTalker
from services.talker.models.qwen3_tts.prompt import (
    PromptSpec,
    TalkerPrompt,
    build_prompt,
    icl_text_tokens_needed,
)
from services.talker.sampling import SamplingParams
from tests import golden
from tests.unit.talker.talker_kit import drive, frames_of

pytestmark = pytest.mark.skipif(
    not (golden.fixture_dir() / golden.CASES_JSON).is_file(),
    reason="Qwen3-TTS golden fixtures not generated yet",
)


@pytest.fixture(scope="module")
def cases() -> dict[str, dict[str, Any]]:
    return golden.load_cases()


@pytest.fixture(scope="module")
def meta() -> dict[str, Any]:
    return golden.load_meta()


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Qwen3TTSTalker]:
    loaded: dict[str, Qwen3TTSTalker] = {}

    def get(variant: str) -> Qwen3TTSTalker:
        if variant not in loaded:
            path: Path = golden.materialize_checkpoint(variant, tmp_path_factory.mktemp(variant))
            loaded[variant] = load_qwen3_tts_talker(path)[0]
        return loaded[variant]

    return get


def generate_cases(cases: dict[str, dict[str, Any]]) -> list[str]:
    return [name for name, case in cases.items() if case["kind"] == "generate"]


def spec_for(case: dict[str, Any], **overrides: Any) -> PromptSpec:
    args = case["args"]
    ids = case["input_ids"].tolist()
    speakers = args.get("speakers")
    fields: dict[str, Any] = {
        "role_ids": ids[:3],
        "text_ids": ids[3:-5],
        "language": args["languages"][0],
        "speaker": speakers[0] if speakers else None,
        "instruct_ids": case["instruct_ids"].tolist() if "instruct_ids" in case else None,
        "non_streaming": args["non_streaming_mode"],
    }
    if args.get("voice_clone"):
        fields["speaker_embedding"] = golden.as_torch(case["x_vector"])
    if args.get("voice_clone") == "icl":
        fields["ref_text_ids"] = case["ref_ids"].tolist()[3:-2]
        fields["ref_codes"] = golden.as_torch(case["ref_code"])
    return PromptSpec(**{**fields, **overrides})


def greedy_request(case: dict[str, Any], prompt: TalkerPrompt) -> TalkerRequest:
    args = case["args"]
    frames = case["num_frames"] + (1 if case["stopped_on_eos"] else 0)
    talker = SamplingParams(do_sample=args["do_sample"], repetition_penalty=float(args["repetition_penalty"]))
    subtalker = SamplingParams(do_sample=args["subtalker_dosample"])
    assert not talker.do_sample and not subtalker.do_sample, "parity cases are greedy"
    return TalkerRequest(
        prompt,
        talker=talker,
        subtalker=subtalker,
        max_new_frames=frames,
        min_new_frames=args["min_new_tokens"],
    )


def close(ours: torch.Tensor, theirs: np.ndarray, tol: float) -> None:
    torch.testing.assert_close(ours.float(), golden.as_torch(theirs).float(), atol=tol, rtol=0)


def test_fixtures_cover_every_variant(cases: dict[str, dict[str, Any]]) -> None:
    names = generate_cases(cases)
    assert {cases[n]["variant"] for n in names} == set(golden.VARIANTS)
    assert any(cases[n]["args"].get("voice_clone") == "icl" for n in names)


@torch.no_grad()
def test_prefill_embeddings_and_logits(
    cases: dict[str, dict[str, Any]], meta: dict[str, Any], models: Callable[[str], Qwen3TTSTalker]
) -> None:
    tol = meta["tolerances"]
    for name in generate_cases(cases):
        case = cases[name]
        model = models(case["variant"])
        prompt = build_prompt(model, spec_for(case))
        close(prompt.prefill_embeds, case["prefill_embeds"], tol["prefill_embeds"])
        close(prompt.pad_embed, case["tts_pad_embed"], tol["prefill_embeds"])
        trailing = prompt.trailing_embeds if prompt.trailing_ids else prompt.pad_embed[None]
        close(trailing, case["trailing_text_hidden"], tol["prefill_embeds"])
        cache = model.allocate_kv_cache(1, prompt.prefill_embeds.shape[0])
        h = prefill(model, prompt.prefill_embeds, cache, slot=0, chunk=7)
        close(model.logits(h), case["prefill_logits_last"], tol["talker_logits"])


@torch.no_grad()
def test_talker_logits_case(
    cases: dict[str, dict[str, Any]], meta: dict[str, Any], models: Callable[[str], Qwen3TTSTalker]
) -> None:
    case = cases["talker_logits"]
    model = models(case["variant"])
    embeds = golden.as_torch(case["prefill_embeds"])
    length = embeds.shape[0]
    cache = model.allocate_kv_cache(1, length)
    hidden = model(embeds[None], torch.arange(length)[None], cache)[0]
    tol = meta["tolerances"]["talker_logits"]
    close(model.logits(hidden[-1]), case["logits_last"], tol)
    if "logits" in case:  # every prefill position, not just the last
        close(model.logits(hidden), case["logits"], tol)


def by_variant(names: list[str], cases: dict[str, dict[str, Any]]) -> dict[str, list[str]]:
    groups: dict[str, list[str]] = {}
    for name in names:
        groups.setdefault(cases[name]["variant"], []).append(name)
    return groups


def check_generation(name: str, case: dict[str, Any], result: TalkerResult, tol: float) -> None:
    expected = golden.as_torch(case["codes"])
    assert result.codes.shape == expected.shape, name
    assert torch.equal(result.codes, expected), name
    assert result.stopped_on_eos == case["stopped_on_eos"], name
    sampled = case["sampled_group0"].tolist()
    assert result.c0 == sampled[: len(result.c0)], name
    close(result.hidden, case["talker_hidden"], tol)


def test_greedy_generation_is_identical(
    cases: dict[str, dict[str, Any]], meta: dict[str, Any], models: Callable[[str], Qwen3TTSTalker]
) -> None:
    # A variant's cases run as one batch (rows of different lengths and modes): the batched loop must
    # reproduce each reference run exactly, which also covers the one-request path.
    for variant, names in by_variant(generate_cases(cases), cases).items():
        model = models(variant)
        requests = [greedy_request(cases[n], build_prompt(model, spec_for(cases[n]))) for n in names]
        for name, result in zip(names, generate(model, requests), strict=True):
            check_generation(name, cases[name], result, meta["tolerances"]["talker_logits"])


def test_generation_covers_enough_frames(cases: dict[str, dict[str, Any]]) -> None:
    longest = {}
    for name in generate_cases(cases):
        variant = cases[name]["variant"]
        longest[variant] = max(longest.get(variant, 0), cases[name]["num_frames"])
    assert all(frames >= 20 for frames in longest.values()), longest


def test_streamed_text_deltas_reproduce_reference(
    cases: dict[str, dict[str, Any]], meta: dict[str, Any], models: Callable[[str], Qwen3TTSTalker]
) -> None:
    streaming = [n for n in generate_cases(cases) if not cases[n]["args"]["non_streaming_mode"]]
    assert streaming
    for variant, names in by_variant(streaming, cases).items():
        model = models(variant)
        requests, pending = [], []
        for name in names:
            full = spec_for(cases[name])
            text = list(full.text_ids)
            # Enough text for the prefill (ICL overlaps text with the reference frames), then a token a tick.
            first = 1
            if full.ref_codes is not None and full.ref_text_ids is not None:
                first = min(
                    len(text), icl_text_tokens_needed(len(full.ref_text_ids), full.ref_codes.shape[0])
                )
            spec = spec_for(cases[name], text_ids=text[:first], text_complete=first == len(text))
            requests.append(greedy_request(cases[name], build_prompt(model, spec)))
            pending.append(text[first:])

        def source(i: int, frames: int, pending: list[list[int]] = pending) -> tuple[list[int], bool] | None:
            rest = pending[i]
            return (rest[frames : frames + 1], frames + 1 >= len(rest)) if frames < len(rest) else None

        for name, result in zip(names, generate(model, requests, text_source=source), strict=True):
            check_generation(name, cases[name], result, meta["tolerances"]["talker_logits"])


class _Recorded(QwenPrepared):
    """A prepared prompt from the fixture's token ids: the fixtures were tokenized by the reference's
    tokenizer, so the adapter's own text path cannot rebuild them. Everything after ``prepare`` serves."""

    def __init__(self, adapter: Qwen3TTSAdapter, prompt: TalkerPrompt) -> None:
        self._adapter = adapter
        self._encoder = None
        self._complete = prompt.text_complete
        self.prompt = prompt
        self._trailing = list(prompt.trailing_ids)
        self._prefix_len = prompt.prefix_len
        self._prefix_key = None


class _RecordedAdapter(Qwen3TTSAdapter):
    def prepare(self, spec: object) -> QwenPrepared:
        assert isinstance(spec, TalkerPrompt)
        return _Recorded(self, spec)


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_greedy_frames_through_the_engine_are_identical(
    cases: dict[str, dict[str, Any]], models: Callable[[str], Qwen3TTSTalker], async_scheduling: bool
) -> None:
    # Each variant's cases share one engine (batched, staggered), through the decode_core the stage graphs.
    for variant, names in by_variant(generate_cases(cases), cases).items():
        model = models(variant)
        adapter = _RecordedAdapter(model, tokenizer=None)  # type: ignore[arg-type]  (prepare is replaced)
        reqs = []
        for name in names:
            g = greedy_request(cases[name], build_prompt(model, spec_for(cases[name])))
            frames = (g.max_new_frames, g.min_new_frames)
            reqs.append(EngineRequest(name, g.prompt, 0, g.talker, g.subtalker, *frames))
        longest = max(r.spec.prefill_embeds.shape[0] + r.max_frames for r in reqs)
        cfg = EngineConfig(
            max_num_seqs=len(reqs), max_model_len=longest, max_num_batched_tokens=64,
            async_scheduling=async_scheduling,
        )  # fmt: skip
        out = drive(TalkerEngine(adapter, cfg), reqs, stagger=2)  # type: ignore[arg-type]
        for name in names:
            case = cases[name]
            assert np.array_equal(frames_of(out[name]), case["codes"]), name
            want = Finish.EOS if case["stopped_on_eos"] else Finish.MAX_FRAMES
            assert out[name][-1].finish is want, name
