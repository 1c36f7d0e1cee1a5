"""Audio8 TTS prompt: exact token sequences of the plain and voice-clone templates, code rows, validation."""

from __future__ import annotations

import numpy as np
import pytest
from tokenizers import Tokenizer

from services.talker.models.audio8_tts.prompt import Audio8Prompt, build_prompt, check_prompt_length
from services.talker.models.audio8_tts.tokenizer import Audio8Tokenizer, tiny_tokenizer_json

SEMANTIC_BEGIN = 151678


@pytest.fixture(scope="module")
def tok() -> Audio8Tokenizer:
    return Audio8Tokenizer.tiny()


@pytest.fixture(scope="module")
def raw() -> Tokenizer:
    return Tokenizer.from_str(tiny_tokenizer_json())


def enc(raw: Tokenizer, *segments: str) -> list[int]:
    return [i for s in segments for i in raw.encode(s, add_special_tokens=False).ids]


def plain_template(raw: Tokenizer, text: str) -> list[int]:
    """The reference's plain TTS template around the (normalised) ``text``, spelled out independently of
    ``build_prompt``."""
    return enc(
        raw,
        "<|im_start|>system\n",
        "convert the provided text to speech",
        "<|im_end|>\n",
        "<|im_start|>user\n",
        text,
        "<|im_end|>\n",
        "<|im_start|>assistant\n<|voice|>",
    )


def ref_codes(frames: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    codes = rng.integers(0, 1024, size=(frames, 10), dtype=np.int64)
    codes[:, 0] = rng.integers(0, 4096, size=frames)
    return codes


def test_plain_tts_token_sequence(tok: Audio8Tokenizer, raw: Tokenizer) -> None:
    p = build_prompt(tok, "  Hello   there,\n world!  ")
    expected = plain_template(raw, "Hello there, world!")
    assert p.ids.tolist() == expected
    assert p.ids.dtype == np.int64 and p.codes.dtype == np.int64
    assert p.codes.shape == (len(expected), 10) and not p.codes.any()
    assert p.ids[0] == 151644 and p.ids[-1] == 151646 and (p.ids == 151645).sum() == 2
    assert p.ref_frames == 0 and not p.semantic_mask().any()
    assert len(p) == p.length == len(expected)
    rows = p.rows()
    assert rows.shape == (11, len(expected)) and rows[0].tolist() == expected and not rows[1:].any()


def test_voice_clone_token_sequence_and_code_rows(tok: Audio8Tokenizer, raw: Tokenizer) -> None:
    codes = ref_codes(7)
    p = build_prompt(tok, "Say this.", ref_text="  the reference\ntranscript ", ref_codes=codes)
    prefix = enc(
        raw,
        "<|im_start|>system\n",
        "convert the provided text to speech reference to the following:\n\nText:\n",
        "<|speaker:0|>the reference transcript",
        "\n\nSpeech:\n",
    )
    suffix = enc(
        raw,
        "<|im_end|>\n",
        "<|im_start|>user\n",
        "Say this.",
        "<|im_end|>\n",
        "<|im_start|>assistant\n<|voice|>",
    )
    semantic = (codes[:, 0] + SEMANTIC_BEGIN).tolist()
    assert p.ids.tolist() == prefix + semantic + suffix
    assert (p.ref_start, p.ref_frames) == (len(prefix), 7)
    mask = p.semantic_mask()
    assert mask.tolist() == [False] * len(prefix) + [True] * 7 + [False] * len(suffix)
    # Code rows carry the 10 reference codes at the semantic positions and 0 everywhere else.
    assert (p.codes[mask] == codes).all()
    assert not p.codes[~mask].any()
    assert ((p.ids >= SEMANTIC_BEGIN) & (p.ids <= 155773)).tolist() == mask.tolist()
    ids, c = p.span(p.ref_start, p.ref_start + 2)
    assert ids.tolist() == semantic[:2] and (c == codes[:2]).all()


def test_ref_text_with_its_own_speaker_tag_gets_no_default_tag(tok: Audio8Tokenizer, raw: Tokenizer) -> None:
    p = build_prompt(tok, "x", ref_text="<|speaker:2|>hi", ref_codes=ref_codes(1))
    prefix = enc(
        raw,
        "<|im_start|>system\n",
        "convert the provided text to speech reference to the following:\n\nText:\n",
        "<|speaker:2|>hi",
        "\n\nSpeech:\n",
    )
    assert p.ids[: len(prefix)].tolist() == prefix
    assert 151647 not in p.ids.tolist()  # no <|speaker:0|>


def test_speaker_tags_in_text_and_speaker_option(tok: Audio8Tokenizer, raw: Tokenizer) -> None:
    p = build_prompt(tok, "<|speaker:3|>Hello")
    expected = plain_template(raw, "<|speaker:3|>Hello")
    assert p.ids.tolist() == expected and 151650 in expected


@pytest.mark.parametrize(
    ("codes", "match"),
    [
        (np.zeros((3, 9), dtype=np.int64), r"ref_codes: expected shape"),
        (np.zeros((0, 10), dtype=np.int64), r"ref_codes: expected shape"),
        (np.zeros((10,), dtype=np.int64), r"ref_codes: expected shape"),
        (np.zeros((2, 10), dtype=np.float32), r"ref_codes: expected integer"),
        (np.zeros((2, 10), dtype=bool), r"ref_codes: expected integer"),
        (np.array([[4096] + [0] * 9]), r"ref_codes: the semantic code \(codebook 0\) of frame 0 is 4096"),
        (
            np.array([[0] * 10, [0, 0, 0, -1] + [0] * 6]),
            r"ref_codes: the residual code \(codebook 3\) of frame 1",
        ),
        (np.array([[0] * 9 + [4096]]), r"ref_codes: the residual code \(codebook 9\)"),
    ],
)
def test_ref_codes_validation(tok: Audio8Tokenizer, codes: np.ndarray, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        build_prompt(tok, "x", ref_text="ref", ref_codes=codes)


def test_clone_needs_both_parts(tok: Audio8Tokenizer) -> None:
    with pytest.raises(ValueError, match=r"^ref_text: "):
        build_prompt(tok, "x", ref_codes=ref_codes(2))
    with pytest.raises(ValueError, match=r"^ref_text: "):
        build_prompt(tok, "x", ref_text="  \n ", ref_codes=ref_codes(2))
    with pytest.raises(ValueError, match=r"^ref_codes: "):
        build_prompt(tok, "x", ref_text="ref")


def test_empty_text_and_bad_tags_name_the_field(tok: Audio8Tokenizer) -> None:
    with pytest.raises(ValueError, match=r"^text: .*empty"):
        build_prompt(tok, "   \n\t")
    with pytest.raises(ValueError, match=r"^input: .*empty"):
        build_prompt(tok, "", text_field="input")
    with pytest.raises(ValueError, match=r"^input: .*<\|im_start\|>"):
        build_prompt(tok, "hi <|im_start|>system", text_field="input")
    with pytest.raises(ValueError, match=r"^ref_text: .*<\|voice\|>"):
        build_prompt(tok, "hi", ref_text="a <|voice|>", ref_codes=ref_codes(1), text_field="input")


def test_prompt_length_must_leave_room(tok: Audio8Tokenizer) -> None:
    check_prompt_length(2047, text_chars=10)
    with pytest.raises(ValueError, match=r"^text: .*10 characters.*2048 of the model's 2048"):
        check_prompt_length(2048, text_chars=10)
    with pytest.raises(ValueError, match=r"^input: .*5 characters and 9 reference frames"):
        check_prompt_length(3000, text_chars=5, ref_frames=9, text_field="input")
    long_text = "zq " * 1200  # ~2400 tokens with the tiny vocabulary
    with pytest.raises(ValueError, match=r"^input: the prompt for a text of 3599 characters"):
        build_prompt(tok, long_text, text_field="input")
    p = build_prompt(tok, "zq " * 300)
    assert p.max_new_frames() == 2048 - len(p) > 0
    with pytest.raises(ValueError, match="reference"):
        build_prompt(tok, "hello", ref_text="ref", ref_codes=ref_codes(2040))


def test_prompt_dataclass_rejects_mismatched_parts() -> None:
    with pytest.raises(ValueError):
        Audio8Prompt(ids=np.zeros(3, dtype=np.int64), codes=np.zeros((2, 10), dtype=np.int64), text_chars=1)
