"""Text tokenizer: loading the checkpoint files, special ids, chat slicing, round trips, streamed deltas."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from services.talker.models.qwen3_tts.tokenizer import (
    ASSISTANT_TEMPLATE,
    SPECIAL_TOKENS,
    QwenTextTokenizer,
    byte_symbols,
    write_tiny_tokenizer,
)
from voxstage.checkpoint import CheckpointError

TEXTS = [
    "Hello, the world! It's 42.",
    "héllo wörld — 日本語のテキスト, emoji 🎙️ and tabs\tand\nnewlines\n\n  indented",
    "  leading spaces, trailing spaces   ",
    "I'LL say: don't/won't; x=3.14159 ... (parens) [brackets] {braces}",
    "",
]


def test_byte_symbols_cover_all_bytes_once() -> None:
    symbols = byte_symbols()
    assert len(symbols) == len(set(symbols)) == 256
    assert symbols[0] == "!" and "Ġ" in symbols and "Ċ" in symbols


def test_special_tokens_sit_at_their_real_ids(tiny_tokenizer: QwenTextTokenizer) -> None:
    for tid, content in SPECIAL_TOKENS.items():
        assert tiny_tokenizer.token_id(content) == tid
    assert tiny_tokenizer.encode("<|im_start|>x<tts_pad>") == [151644, tiny_tokenizer.encode("x")[0], 151671]


@pytest.mark.parametrize("text", TEXTS)
def test_round_trip(tiny_tokenizer: QwenTextTokenizer, text: str) -> None:
    ids = tiny_tokenizer.encode(text)
    assert tiny_tokenizer.decode(ids) == text


def test_merges_apply(tiny_tokenizer: QwenTextTokenizer) -> None:
    assert len(tiny_tokenizer.encode("assistant")) == 1
    assert len(tiny_tokenizer.encode(" the")) == 1
    assert len(tiny_tokenizer.encode("xyz")) == 3


def test_chat_formatting_and_slices(tiny_tokenizer: QwenTextTokenizer) -> None:
    role, text = tiny_tokenizer.assistant_ids("Hi there")
    assert role == tiny_tokenizer.role_ids() and len(role) == 3 and role[0] == 151644
    assert tiny_tokenizer.decode(text) == "Hi there"
    full = tiny_tokenizer.encode(ASSISTANT_TEMPLATE.format(text="Hi there"))
    assert full == role + text + [151645, tiny_tokenizer.encode("\n")[0]] + role
    assert tiny_tokenizer.decode(tiny_tokenizer.ref_text_ids("ref words")) == "ref words"
    instruct = tiny_tokenizer.instruct_ids("calm voice")
    assert tiny_tokenizer.decode(instruct) == "<|im_start|>user\ncalm voice<|im_end|>\n"


def _random_text(rng: random.Random) -> str:
    alphabet = "ab cd ,.!?'\n\t  12 ÉÜ日本 's 't don ll" + "\n\n"
    return "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 60)))


def test_incremental_encoding_equals_whole_text(tiny_tokenizer: QwenTextTokenizer) -> None:
    rng = random.Random(0)
    texts = [*TEXTS, *(_random_text(rng) for _ in range(300))]
    for text in texts:
        enc = tiny_tokenizer.incremental()
        ids: list[int] = []
        cuts = sorted(rng.sample(range(len(text) + 1), k=min(len(text) + 1, rng.randint(1, 8))))
        last = 0
        for cut in [*cuts, len(text)]:
            ids += enc.push(text[last:cut])
            last = cut
        ids += enc.flush()
        assert ids == tiny_tokenizer.encode(text), repr(text)


def test_incremental_emits_stable_prefix_early(tiny_tokenizer: QwenTextTokenizer) -> None:
    enc = tiny_tokenizer.incremental()
    assert enc.push("Hello") == []  # the word may still grow
    first = enc.push(" wor")
    assert tiny_tokenizer.decode(first) == "Hello"
    assert enc.pending_text == " wor"


def test_declared_id_mismatch_is_rejected(tmp_path: Path) -> None:
    write_tiny_tokenizer(tmp_path)
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    config["added_tokens_decoder"]["151690"] = config["added_tokens_decoder"].pop("151671")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="tts_pad"):
        QwenTextTokenizer.from_dir(tmp_path)


def test_specials_absent_from_vocab_get_sequential_ids(tmp_path: Path) -> None:
    # The released vocab.json stops at 151642 and the specials follow it; assignment must reproduce that.
    write_tiny_tokenizer(tmp_path)
    vocab = json.loads((tmp_path / "vocab.json").read_text())
    for content in ("<tts_pad>", "<tts_text_bos>", "<tts_text_eod>"):
        del vocab[content]
    (tmp_path / "vocab.json").write_text(json.dumps(vocab))
    tok = QwenTextTokenizer.from_dir(tmp_path)
    assert [tok.token_id(c) for c in ("<tts_pad>", "<tts_text_bos>", "<tts_text_eod>")] == [
        151671,
        151672,
        151673,
    ]


def test_missing_files_are_named(tmp_path: Path) -> None:
    write_tiny_tokenizer(tmp_path)
    (tmp_path / "merges.txt").unlink()
    with pytest.raises(CheckpointError, match="merges.txt"):
        QwenTextTokenizer.from_dir(tmp_path)
