"""Prompt construction: layout of every mode (models.md §1.4), dialect rules and request validation."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from services.talker.models.qwen3_tts.model import Qwen3TTSTalker
from services.talker.models.qwen3_tts.prompt import (
    PromptError,
    PromptParts,
    PromptSpec,
    build_prompt,
    icl_text_tokens_needed,
)

ModelFactory = Callable[[str], Qwen3TTSTalker]
ROLE = [151644, 300, 198]
TEXT = [1000, 1001, 1002, 1003, 1004]
TTS_PAD, TTS_BOS, TTS_EOS = 151671, 151672, 151673


def ids(*values: int) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64)


@torch.no_grad()
def test_custom_voice_streaming_layout(tiny_model: ModelFactory) -> None:
    m = tiny_model("custom_voice")
    t = m.config.talker
    p = build_prompt(m, PromptSpec(ROLE, TEXT, language="English", speaker="Ryan"))
    pad, bos = m.embed_text(ids(TTS_PAD, TTS_BOS))
    codec = [t.codec_think_id, t.codec_think_bos_id, t.codec_language_id["english"], t.codec_think_eos_id]
    codec += [t.spk_id["ryan"], t.codec_pad_id]
    expected = torch.cat(
        [
            m.embed_text(ids(*ROLE)),
            m.embed_codec(ids(*codec)) + torch.stack([pad] * 5 + [bos]),
            m.embed_text(ids(TEXT[0])) + m.embed_codec(ids(t.codec_bos_id)),
        ]
    )
    torch.testing.assert_close(p.prefill_embeds, expected)
    assert p.trailing_ids == TEXT[1:] + [TTS_EOS]
    assert p.prefix_len == 9  # role + the text-independent codec rows
    other = build_prompt(m, PromptSpec(ROLE, [7, 8, 9], language="English", speaker="Ryan"))
    torch.testing.assert_close(other.prefill_embeds[:9], p.prefill_embeds[:9])
    torch.testing.assert_close(p.trailing_embeds, m.embed_text(ids(*p.trailing_ids)))
    torch.testing.assert_close(p.pad_embed, pad)


@torch.no_grad()
def test_trailing_text_is_projected_only_when_asked_for(
    tiny_model: ModelFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The serving engine projects each frame's trailing token in its step: building a prompt projects the
    first text token alone, and ``trailing_embeds`` is computed on first access (then kept)."""
    m = tiny_model("custom_voice")
    projected: list[int] = []
    real = m.embed_text

    def counted(x: torch.Tensor) -> torch.Tensor:
        projected.append(x.numel())
        return real(x)

    parts = PromptParts()  # the role and specials, as the adapter keeps them
    build_prompt(m, PromptSpec(ROLE, [7, 8], language="English", speaker="Ryan"), parts)
    monkeypatch.setattr(m, "embed_text", counted)
    p = build_prompt(m, PromptSpec(ROLE, TEXT, language="English", speaker="Ryan"), parts)
    assert projected == [1]  # the first text token
    first = p.trailing_embeds
    assert projected == [1, len(TEXT)] and p.trailing_embeds is first  # text[1:] + tts_eos, once
    torch.testing.assert_close(first, real(ids(*p.trailing_ids)))


@torch.no_grad()
def test_non_streaming_layout_and_auto_language(tiny_model: ModelFactory) -> None:
    m = tiny_model("custom_voice")
    t = m.config.talker
    p = build_prompt(m, PromptSpec(ROLE, TEXT, language="auto", speaker="vivian", non_streaming=True))
    # role 3 + [nothink, think_bos, think_eos, spk, pad] 5 + text+eos 6 + final 1
    assert p.prefill_embeds.shape[0] == 3 + 5 + 6 + 1 and p.trailing_ids == []
    pad, eos = m.embed_text(ids(TTS_PAD, TTS_EOS))
    torch.testing.assert_close(p.prefill_embeds[3], pad + m.embed_codec(ids(t.codec_nothink_id))[0])
    body = torch.cat([m.embed_text(ids(*TEXT)), eos[None]]) + m.embed_codec(ids(t.codec_pad_id))
    torch.testing.assert_close(p.prefill_embeds[8:14], body)
    torch.testing.assert_close(p.prefill_embeds[-1], pad + m.embed_codec(ids(t.codec_bos_id))[0])


@torch.no_grad()
@pytest.mark.parametrize("language,dialect", [("auto", True), ("chinese", True), ("english", False)])
def test_dialect_speaker_switches_language(tiny_model: ModelFactory, language: str, dialect: bool) -> None:
    m = tiny_model("custom_voice")
    t = m.config.talker
    p = build_prompt(m, PromptSpec(ROLE, TEXT, language=language, speaker="eric"))
    lang = t.codec_language_id["sichuan_dialect" if dialect else language]
    pad = m.embed_text(ids(TTS_PAD))[0]
    torch.testing.assert_close(p.prefill_embeds[5], pad + m.embed_codec(ids(lang))[0])


@torch.no_grad()
def test_voice_design_instruct_comes_first(tiny_model: ModelFactory) -> None:
    m = tiny_model("voice_design")
    instruct = [151644, 400, 198, 1500, 1501, 151645, 198]
    p = build_prompt(m, PromptSpec(ROLE, TEXT, language="english", instruct_ids=instruct))
    torch.testing.assert_close(p.prefill_embeds[:7], m.embed_text(ids(*instruct)))
    assert p.prefill_embeds.shape[0] == 7 + 3 + 5 + 1  # no speaker row


@torch.no_grad()
def test_base_icl_streaming_overlap_and_padding(tiny_model: ModelFactory) -> None:
    m = tiny_model("base")
    t = m.config.talker
    xvec = torch.randn(m.hidden_size)
    ref_ids = [2000, 2001]
    ref_codes = torch.randint(0, 2048, (4, 16))
    codec = torch.cat([m.embed_codec(ids(t.codec_bos_id)), m.embed_frame(ref_codes)])  # 5 positions
    spec = PromptSpec(
        ROLE, TEXT, language="english", speaker_embedding=xvec, ref_text_ids=ref_ids, ref_codes=ref_codes
    )
    long = build_prompt(m, spec)  # 2 + 5 + eos = 8 text positions > 5 codec positions
    all_ids = ref_ids + TEXT + [TTS_EOS]
    assert long.trailing_ids == all_ids[5:]
    head = torch.cat([m.embed_text(ids(*ref_ids, *TEXT)), m.embed_text(ids(TTS_EOS))])[:5]
    torch.testing.assert_close(long.prefill_embeds[-5:], head + codec)
    torch.testing.assert_close(long.prefill_embeds[7], xvec + m.embed_text(ids(TTS_PAD))[0])
    assert torch.equal(long.ref_codes, ref_codes)

    short = build_prompt(
        m,
        PromptSpec(
            ROLE, TEXT[:1], "english", speaker_embedding=xvec, ref_text_ids=ref_ids, ref_codes=ref_codes
        ),
    )
    assert short.trailing_ids == []  # 2 + 1 + eos = 4 < 5: padded with tts_pad instead
    pad = m.embed_text(ids(TTS_PAD))
    tail = torch.cat([m.embed_text(ids(*ref_ids, TEXT[0])), m.embed_text(ids(TTS_EOS)), pad]) + codec
    torch.testing.assert_close(short.prefill_embeds[-5:], tail)


@torch.no_grad()
def test_streamed_text_prompt_has_no_eos_yet(tiny_model: ModelFactory) -> None:
    m = tiny_model("custom_voice")
    p = build_prompt(m, PromptSpec(ROLE, TEXT[:2], speaker="ryan", text_complete=False))
    assert p.trailing_ids == TEXT[1:2] and not p.text_complete
    feed = p.text_feed()
    assert not feed.starved(0) and feed.starved(1)
    assert feed.push([7, 8]) == [7, 8] and not feed.starved(2) and feed.starved(3)
    assert feed.push([], complete=True) == [TTS_EOS] and not feed.starved(100)
    with pytest.raises(PromptError, match="already complete"):
        feed.push([1])


def test_icl_text_tokens_needed() -> None:
    assert icl_text_tokens_needed(ref_text_len=2, ref_frames=4) == 3
    assert icl_text_tokens_needed(ref_text_len=20, ref_frames=4) == 1


@pytest.mark.parametrize(
    "variant,changes,field",
    [
        ("custom_voice", {"speaker": "nobody"}, "speaker"),
        ("custom_voice", {"speaker": None}, "speaker"),
        ("custom_voice", {"language": "sichuan_dialect"}, "language"),
        ("custom_voice", {"language": "klingon"}, "language"),
        ("custom_voice", {"text_ids": []}, "text"),
        ("custom_voice", {"role_ids": [1, 2]}, "role_ids"),
        ("custom_voice", {"non_streaming": True, "text_complete": False}, "non_streaming"),
        ("custom_voice", {"text_ids": [10**6]}, "text_ids"),
        ("custom_voice", {"text_ids": [5, -1, 6]}, "text_ids"),
        ("base", {"ref_text_ids": [5, 10**6], "ref_codes": torch.zeros(3, 16).long()}, "ref_text_ids"),
        ("custom_voice", {"speaker_embedding": torch.zeros(64)}, "speaker_embedding"),
        ("voice_design", {"speaker": "ryan"}, "speaker"),
        ("base", {"speaker_embedding": None}, "speaker_embedding"),
        ("base", {"speaker_embedding": torch.zeros(3)}, "speaker_embedding"),
        ("base", {"ref_codes": torch.zeros(3, 16, dtype=torch.int64)}, "ref_text"),
        ("base", {"ref_text_ids": [5], "ref_codes": torch.zeros(3, 8, dtype=torch.int64)}, "ref_codes"),
        ("base", {"ref_text_ids": [5], "ref_codes": torch.full((3, 16), 4096)}, "ref_codes"),
        ("base", {"instruct_ids": [1, 2]}, "instruct"),
    ],
)
def test_invalid_requests_name_the_field(
    tiny_model: ModelFactory, variant: str, changes: dict, field: str
) -> None:
    m = tiny_model(variant)
    base: dict = {"role_ids": ROLE, "text_ids": TEXT, "language": "english"}
    if variant == "custom_voice":
        base["speaker"] = "ryan"
    if variant == "voice_design":
        base["instruct_ids"] = [1, 2, 3]
    if variant == "base":
        base["speaker_embedding"] = torch.zeros(m.hidden_size)
    with pytest.raises(PromptError, match=field):
        build_prompt(m, PromptSpec(**{**base, **changes}))


def test_streaming_icl_needs_enough_text(tiny_model: ModelFactory) -> None:
    m = tiny_model("base")
    spec = PromptSpec(
        ROLE,
        TEXT[:1],
        "english",
        speaker_embedding=torch.zeros(m.hidden_size),
        ref_text_ids=[9],
        ref_codes=torch.zeros(6, 16, dtype=torch.int64),
        text_complete=False,
    )
    with pytest.raises(PromptError, match="needs 6 text tokens"):
        build_prompt(m, spec)
