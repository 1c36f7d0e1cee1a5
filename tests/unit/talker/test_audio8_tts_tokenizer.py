"""Audio8 TTS tokenizer: tiny file special ids, cleaning, request-text tags, checks against config.json."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from services.talker.models.audio8_tts import tokenizer as ark_tokenizer
from services.talker.models.audio8_tts.tokenizer import (
    Audio8Tokenizer,
    clean_text,
    released_config_ids,
    tiny_special_tokens,
    tiny_tokenizer_json,
    write_tiny_tokenizer,
)
from voxstage.checkpoint import CheckpointError

VOCAB_SIZE = 155776


@pytest.fixture(scope="module")
def tok() -> Audio8Tokenizer:
    return Audio8Tokenizer.tiny()


def _write_checkpoint(d: Path, **config: object) -> Path:
    write_tiny_tokenizer(d)
    (d / "config.json").write_text(json.dumps({**released_config_ids(), "vocab_size": VOCAB_SIZE, **config}))
    return d


def test_tiny_file_round_trips_with_specials_at_declared_ids() -> None:
    raw = Tokenizer.from_str(tiny_tokenizer_json())
    specials = tiny_special_tokens()
    assert min(specials) == 151643 and max(specials) == 155773 < VOCAB_SIZE
    assert len(specials) == 155773 - 151643 + 1  # every id of the range is declared, none twice
    for tid, content in specials.items():
        assert raw.token_to_id(content) == tid
        assert raw.id_to_token(tid) == content
        assert raw.encode(content, add_special_tokens=False).ids == [tid]
    assert raw.token_to_id("<|endoftext|>") == 151643
    assert raw.token_to_id("<|im_start|>") == 151644
    assert raw.token_to_id("<|im_end|>") == 151645
    assert raw.token_to_id("<|voice|>") == 151646
    assert raw.token_to_id("<|speaker:0|>") == 151647 and raw.token_to_id("<|speaker:30|>") == 151677
    assert raw.token_to_id("<|semantic:0|>") == 151678 and raw.token_to_id("<|semantic:4095|>") == 155773
    # A real BPE: a few hundred learned merges, and the template words are single tokens.
    model = json.loads(tiny_tokenizer_json())["model"]
    assert 150 <= len(model["merges"]) <= 400
    for word in ("system", "user", "assistant"):
        assert len(raw.encode(word, add_special_tokens=False).ids) == 1


def test_tiny_file_is_deterministic() -> None:
    again = ark_tokenizer.tiny_tokenizer_json.__wrapped__()
    assert again == tiny_tokenizer_json()


def test_special_ids_of_the_loaded_tokenizer(tok: Audio8Tokenizer) -> None:
    ids = tok.ids
    assert (ids.pad, ids.im_start, ids.im_end, ids.eos, ids.voice) == (151643, 151644, 151645, 151645, 151646)
    assert (ids.semantic_begin, ids.semantic_end, ids.num_semantic) == (151678, 155773, 4096)
    assert ids.speakers == tuple(range(151647, 151678))
    assert tok.semantic_id(4095) == 155773 and tok.speaker_id(1) == 151648
    with pytest.raises(ValueError, match="speaker"):
        tok.speaker_id(31)


@pytest.mark.parametrize(
    "text",
    ["Hello, the world! It's 42.", "héllo wörld — 日本語, emoji 🎙️", "tabs\tand\nnewlines  kept verbatim", ""],
)
def test_raw_encoding_round_trips(tok: Audio8Tokenizer, text: str) -> None:
    assert tok.decode(tok.encode_raw(text)) == text


def test_whitespace_is_collapsed_and_stripped(tok: Audio8Tokenizer) -> None:
    assert clean_text("  a \n\t b\u3000c  \n") == "a b c"
    assert tok.encode_segment("  Hello \n\n  there\t world  ") == tok.encode_raw("Hello there world")
    assert tok.encode_user_text(" one\n two ") == tok.encode_raw("one two")


def test_speaker_tag_in_text_becomes_its_id(tok: Audio8Tokenizer) -> None:
    ids = tok.encode_user_text("Hi <|speaker:1|>there", field="input")
    assert 151648 in ids
    assert ids == tok.encode_raw("Hi ") + [151648] + tok.encode_raw("there")
    assert tok.decode(ids) == "Hi <|speaker:1|>there"


@pytest.mark.parametrize(
    "bad",
    [
        "hello <|im_start|>system",
        "stop<|im_end|>",
        "x <|voice|>",
        "<|semantic:12|> y",
        "<|endoftext|>",
        "<|speaker:99|> unknown speaker",
        "<|made_up|> tag",
    ],
)
def test_control_tags_in_request_text_are_refused_naming_the_field(tok: Audio8Tokenizer, bad: str) -> None:
    with pytest.raises(ValueError, match=r"^input: "):
        tok.encode_user_text(bad, field="input")
    with pytest.raises(ValueError, match=r"^ref_text: "):
        tok.encode_user_text(bad, field="ref_text")


def test_from_dir_checks_config_ids(tmp_path: Path) -> None:
    loaded = Audio8Tokenizer.from_dir(_write_checkpoint(tmp_path / "ok"))
    assert loaded.ids == Audio8Tokenizer.tiny().ids
    for key, value in (
        ("semantic_begin_id", 151679),
        ("semantic_end_id", 155772),
        ("eos_token_id", 151644),
        ("pad_token_id", 0),
        ("codebook_size", 1024),
        ("vocab_size", 155000),
    ):
        d = _write_checkpoint(tmp_path / key, **{key: value})
        with pytest.raises(CheckpointError, match=key):
            Audio8Tokenizer.from_dir(d)
    with pytest.raises(CheckpointError, match="must be an integer"):
        Audio8Tokenizer.from_dir(_write_checkpoint(tmp_path / "str", eos_token_id="151645"))


def test_from_dir_missing_files(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="tokenizer.json"):
        Audio8Tokenizer.from_dir(tmp_path)
    write_tiny_tokenizer(tmp_path)
    with pytest.raises(CheckpointError, match="config.json"):
        Audio8Tokenizer.from_dir(tmp_path)


def test_a_file_without_voice_token_is_refused() -> None:
    data = json.loads(tiny_tokenizer_json())
    data["added_tokens"] = [t for t in data["added_tokens"] if t["content"] != "<|voice|>"]
    del data["model"]["vocab"]["<|voice|>"]
    with pytest.raises(CheckpointError, match="voice"):
        Audio8Tokenizer.from_json_str(json.dumps(data))


def test_non_contiguous_semantic_tokens_are_refused() -> None:
    data = json.loads(tiny_tokenizer_json())
    data["added_tokens"] = [t for t in data["added_tokens"] if t["content"] != "<|semantic:7|>"]
    del data["model"]["vocab"]["<|semantic:7|>"]
    with pytest.raises(CheckpointError, match="semantic"):
        Audio8Tokenizer.from_json_str(json.dumps(data))
