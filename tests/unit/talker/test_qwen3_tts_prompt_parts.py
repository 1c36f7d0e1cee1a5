"""``PromptParts`` keeps the rows of a Qwen3-TTS prompt that no request changes (specials, role, think rows,
preset speakers, instructions, the prefix they make). A prompt built from them must be the prompt built from
scratch, bit for bit, for every golden case (each variant, streaming and not, instructions, dialect
speakers, voice clones with and without ICL), the first time a part is kept and every time after; and a
request's own rows (its text, its x-vector) must never be kept."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from services.talker.models.qwen3_tts.prompt import NO_PARTS, PromptParts, TalkerPrompt, build_prompt
from tests.unit.talker.test_qwen3_tts_talker_golden import (  # noqa: F401
    cases,
    generate_cases,
    models,
    pytestmark,  # noqa: F401 - skipped as it is
    spec_for,
)


def same(a: TalkerPrompt, b: TalkerPrompt) -> None:
    assert torch.equal(a.prefill_embeds, b.prefill_embeds)
    assert torch.equal(a.trailing_embeds, b.trailing_embeds) and a.trailing_ids == b.trailing_ids
    assert torch.equal(a.pad_embed, b.pad_embed)
    assert a.prefix_len == b.prefix_len and a.text_complete == b.text_complete


@pytest.mark.parametrize("non_streaming", [None, True, False], ids=["as-cased", "non-streaming", "streaming"])
def test_prompts_from_kept_parts_equal_prompts_from_scratch(
    cases: dict[str, dict[str, Any]],  # noqa: F811
    models: Any,  # noqa: F811
    non_streaming: bool | None,
) -> None:
    parts: dict[str, PromptParts] = {}
    for _ in range(2):  # the first round fills the parts, the second reads them
        for name in generate_cases(cases):
            case = cases[name]
            model = models(case["variant"])
            kept = parts.setdefault(case["variant"], PromptParts())
            spec = spec_for(case, **({} if non_streaming is None else {"non_streaming": non_streaming}))
            same(build_prompt(model, spec, kept), build_prompt(model, spec))
    assert all(len(p) > 0 for p in parts.values())


def test_a_requests_own_rows_are_never_kept(
    cases: dict[str, dict[str, Any]],  # noqa: F811
    models: Any,  # noqa: F811
) -> None:
    clones = [n for n in generate_cases(cases) if cases[n]["args"].get("voice_clone")]
    assert clones
    case = cases[clones[0]]
    model = models(case["variant"])
    parts = PromptParts()
    build_prompt(model, spec_for(case), parts)
    kept = len(parts)
    other = spec_for(case, speaker_embedding=-spec_for(case).speaker_embedding, text_ids=[11, 12, 13, 14])
    same(build_prompt(model, other, parts), build_prompt(model, other))  # another voice, another text
    assert len(parts) == kept  # nothing of theirs went in: x-vector rows and texts are the request's
    assert len(NO_PARTS) == 0


def test_parts_stop_growing_at_their_bound(
    cases: dict[str, dict[str, Any]],  # noqa: F811
    models: Any,  # noqa: F811
) -> None:
    with_instruct = [n for n in generate_cases(cases) if "instruct_ids" in cases[n]]
    assert with_instruct
    case = cases[with_instruct[0]]
    model = models(case["variant"])
    parts = PromptParts(max_entries=8)
    for i in range(20):  # twenty instructions: a new part each, kept only while there is room
        spec = spec_for(case, instruct_ids=[*spec_for(case).instruct_ids, 100 + i])
        same(build_prompt(model, spec, parts), build_prompt(model, spec))
    assert len(parts) == 8
    small = PromptParts(max_bytes=parts.bytes // 2)  # a bound in bytes too: long instructions are not kept
    for i in range(20):
        spec = spec_for(case, instruct_ids=[*spec_for(case).instruct_ids, 100 + i])
        same(build_prompt(model, spec, small), build_prompt(model, spec))
    assert 0 < small.bytes <= small.max_bytes and len(small) < 8
