"""Qwen3-TTS text tokenizer: Qwen2 byte-level BPE read from a checkpoint's vocab/merges/tokenizer_config.

The checkpoint ships slow-tokenizer files only (``vocab.json``, ``merges.txt``, ``tokenizer_config.json``);
the pipeline below is the one the Qwen2 fast tokenizer is built with: NFC, a regex split, byte-level mapping,
BPE without an unknown token, and the added special tokens at the ids ``added_tokens_decoder`` declares.

Reference quirk (not reproduced): qwen-tts loads its processor with ``fix_mistral_regex=True``; transformers
4.57.3 then swaps in a Mistral split regex for *local* checkpoint directories whose ``config.json`` names a
transformers version in (4.57.2, 5.0). We keep the Qwen2 regex the model was trained with.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers
from tokenizers.models import BPE

from voxstage.checkpoint import CheckpointError, read_json

# The Qwen2 pre-tokenizer split (contractions, letter runs with one leading non-letter, single digits,
# punctuation runs, newline runs, trailing spaces).
QWEN2_SPLIT_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"""
    r"""|\s+(?!\S)|\s+"""
)

ASSISTANT_TEMPLATE = "<|im_start|>assistant\n{text}<|im_end|>\n<|im_start|>assistant\n"
REF_TEMPLATE = "<|im_start|>assistant\n{text}<|im_end|>\n"
INSTRUCT_TEMPLATE = "<|im_start|>user\n{instruct}<|im_end|>\n"
ROLE_TEXT = "<|im_start|>assistant\n"

# Special tokens of the Qwen3 family as Qwen3-TTS ships them (id -> content).
SPECIAL_TOKENS: dict[int, str] = {
    151643: "<|endoftext|>",
    151644: "<|im_start|>",
    151645: "<|im_end|>",
    151646: "<|object_ref_start|>",
    151647: "<|object_ref_end|>",
    151648: "<|box_start|>",
    151649: "<|box_end|>",
    151650: "<|quad_start|>",
    151651: "<|quad_end|>",
    151652: "<|vision_start|>",
    151653: "<|vision_end|>",
    151654: "<|vision_pad|>",
    151655: "<|image_pad|>",
    151656: "<|video_pad|>",
    151657: "<tool_call>",
    151658: "</tool_call>",
    151659: "<|fim_prefix|>",
    151660: "<|fim_middle|>",
    151661: "<|fim_suffix|>",
    151662: "<|fim_pad|>",
    151663: "<|repo_name|>",
    151664: "<|file_sep|>",
    151665: "<tool_response>",
    151666: "</tool_response>",
    151667: "<think>",
    151668: "</think>",
    151669: "<|audio_start|>",
    151670: "<|audio_end|>",
    151671: "<tts_pad>",
    151672: "<tts_text_bos>",
    151673: "<tts_text_eod>",
    151674: "<tts_text_bos_single>",
    151675: "<|audio_pad|>",
}
# Tokens the Qwen2 tokenizer marks non-special (they survive skip_special_tokens when decoding).
_NON_SPECIAL = {
    151657,
    151658,
    151659,
    151660,
    151661,
    151662,
    151663,
    151664,
    151665,
    151666,
    151667,
    151668,
}


def qwen2_pre_tokenizer() -> pre_tokenizers.PreTokenizer:
    """The Qwen2 regex split, then the byte-level mapping (the split already isolated the words)."""
    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_SPLIT_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )


def qwen2_bpe(vocab: dict[str, int], merges: list[tuple[str, str]]) -> Tokenizer:
    """The pipeline the Qwen2 fast tokenizer is built with (NFC, ``qwen2_pre_tokenizer``, byte-level BPE
    without an unknown token), before any added tokens."""
    tok = Tokenizer(BPE(vocab=vocab, merges=merges, unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = qwen2_pre_tokenizer()
    tok.decoder = decoders.ByteLevel()
    return tok


def byte_symbols() -> list[str]:
    """The 256 byte-level symbols in GPT-2/Qwen vocabulary order (printable bytes first, then the rest)."""
    printable = (
        list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    )
    symbol = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in symbol:
            symbol[b] = chr(256 + extra)
            extra += 1
    return [symbol[b] for b in printable] + [symbol[b] for b in range(256) if b not in printable]


class BackedTokenizer:
    """What a family tokenizer over one ``tokenizers.Tokenizer`` shares (Qwen3-TTS, Audio8-TTS): decoding,
    id lookup by content, and the backend itself."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tok = tokenizer

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_id(self, content: str) -> int:
        tid = self._tok.token_to_id(content)
        if tid is None:
            raise KeyError(f"token {content!r} is not in the tokenizer vocabulary")
        return tid

    @property
    def backend(self) -> Tokenizer:
        return self._tok


class QwenTextTokenizer(BackedTokenizer):
    """Byte-level BPE with Qwen2's normalizer/pre-tokenizer and the checkpoint's special tokens."""

    MEMO_ENTRIES = 256  # transcripts and instructions kept tokenized (a voice's transcript recurs)

    def __init__(self, tokenizer: Tokenizer, special_ids: dict[str, int]) -> None:
        super().__init__(tokenizer)
        self.special_ids = special_ids
        self._memo: dict[tuple[str, str], tuple[int, ...]] = {}

    def _memoized(self, kind: str, text: str, make: Callable[[], list[int]]) -> list[int]:
        """``make()`` for a text that recurs (a voice-library voice's transcript, an instruction), kept
        while there is room: the same ids, without tokenizing them on every request."""
        ids = self._memo.get((kind, text))
        if ids is None:
            ids = tuple(make())
            if len(self._memo) < self.MEMO_ENTRIES:
                self._memo[(kind, text)] = ids
        return list(ids)

    @classmethod
    def from_dir(cls, directory: Path) -> QwenTextTokenizer:
        directory = Path(directory)
        vocab_path, merges_path = directory / "vocab.json", directory / "merges.txt"
        vocab = read_json(vocab_path)
        if not all(isinstance(k, str) and isinstance(v, int) for k, v in vocab.items()):
            raise CheckpointError(f"{vocab_path} must map token strings to integer ids")
        if not merges_path.is_file():
            raise CheckpointError(f"missing file {merges_path}")
        merges: list[tuple[str, str]] = []
        for n, line in enumerate(merges_path.read_text(encoding="utf-8").splitlines(), start=1):
            if not line or line.startswith("#version"):
                continue
            parts = line.split(" ")
            if len(parts) != 2:
                raise CheckpointError(
                    f"{merges_path}:{n}: a merge must be two symbols separated by one space"
                )
            merges.append((parts[0], parts[1]))
        config_path = directory / "tokenizer_config.json"
        config = read_json(config_path)
        tok = qwen2_bpe(vocab, merges)
        special_ids = _add_declared_tokens(tok, config, config_path)
        return cls(tok, special_ids)

    # ---- raw encoding (decoding: BackedTokenizer) ------------------------------------------------
    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``; special-token strings inside it are recognised, as in the reference."""
        return list(self._tok.encode(text, add_special_tokens=False).ids)

    # ---- Qwen3-TTS chat formatting ---------------------------------------------------------------
    def assistant_ids(self, text: str) -> tuple[list[int], list[int]]:
        """``(role_ids, text_ids)`` exactly as the reference slices them: ``ids[:3]`` and ``ids[3:-5]``.

        The whole template is tokenized at once (not the text alone) so boundary effects match.
        """
        ids = self.encode(ASSISTANT_TEMPLATE.format(text=text))
        return ids[:3], ids[3:-5]

    def role_ids(self) -> list[int]:
        """The role prefix ``<|im_start|>assistant\\n`` alone (for prompts whose text arrives streamed)."""
        return self.encode(ROLE_TEXT)

    def ref_text_ids(self, ref_text: str) -> list[int]:
        """Transcript ids for voice-clone ICL, sliced as the reference does (``ids[3:-2]``)."""
        return self._memoized("ref", ref_text, lambda: self.encode(REF_TEMPLATE.format(text=ref_text))[3:-2])

    def instruct_ids(self, instruct: str) -> list[int]:
        """The whole ``<|im_start|>user\\n{instruct}<|im_end|>\\n`` block; it is projected in full."""
        return self._memoized(
            "instruct", instruct, lambda: self.encode(INSTRUCT_TEMPLATE.format(instruct=instruct))
        )

    def incremental(self) -> IncrementalEncoder:
        return IncrementalEncoder(self)


def _add_declared_tokens(tok: Tokenizer, config: dict[str, object], path: Path) -> dict[str, int]:
    declared = config.get("added_tokens_decoder")
    if not isinstance(declared, dict) or not declared:
        raise CheckpointError(f"{path}: added_tokens_decoder must be a non-empty object")
    entries: list[tuple[int, str, bool]] = []
    for key, spec in declared.items():
        if not isinstance(key, str) or not key.isdigit():
            raise CheckpointError(f"{path}: added_tokens_decoder key {key!r} is not a token id")
        if not isinstance(spec, dict) or not isinstance(spec.get("content"), str):
            raise CheckpointError(f"{path}: added_tokens_decoder.{key}.content must be a string")
        entries.append((int(key), spec["content"], bool(spec.get("special", True))))
    special_ids: dict[str, int] = {}
    # Ascending order: tokens absent from vocab.json get the next free id, which must be the declared one.
    for tid, content, special in sorted(entries):
        added = AddedToken(
            content, special=special, normalized=False, lstrip=False, rstrip=False, single_word=False
        )
        if special:
            tok.add_special_tokens([added])
        else:
            tok.add_tokens([added])
        got = tok.token_to_id(content)
        if got != tid:
            raise CheckpointError(
                f"{path}: added_tokens_decoder puts {content!r} at {tid} but the vocabulary has it at {got}"
            )
        special_ids[content] = tid
    return special_ids


class IncrementalEncoder:
    """Turns text deltas into token ids that equal tokenizing the concatenated text in one go.

    BPE never merges across pre-tokens, so a pre-token whose extent can no longer change may be emitted.
    The last pre-token can still grow, and whitespace runs can still fuse with later newlines
    (``\\s*[\\r\\n]+``), so the trailing piece and any whitespace-only pieces right before it are held back
    until more text or ``flush()`` arrives. Special-token strings typed across a delta boundary are the
    one case where this differs from whole-text encoding.
    """

    def __init__(self, tokenizer: QwenTextTokenizer) -> None:
        self._tokenizer = tokenizer
        self._split = pre_tokenizers.Split(Regex(QWEN2_SPLIT_REGEX), behavior="isolated", invert=False)
        self._pending = ""

    @property
    def pending_text(self) -> str:
        return self._pending

    def push(self, delta: str) -> list[int]:
        self._pending += delta
        pieces = self._split.pre_tokenize_str(self._pending)
        if len(pieces) <= 1:
            return []
        keep_from = len(pieces) - 1
        while keep_from > 0 and pieces[keep_from - 1][0].isspace():
            keep_from -= 1
        cut = pieces[keep_from][1][0]
        if cut == 0:
            return []
        ready, self._pending = self._pending[:cut], self._pending[cut:]
        return self._tokenizer.encode(ready)

    def flush(self) -> list[int]:
        ready, self._pending = self._pending, ""
        return self._tokenizer.encode(ready) if ready else []


# ---- tiny tokenizer for tests and the demo preset --------------------------------------------------
# Merges are chosen so the chat roles are single tokens ("assistant", "user"), which keeps the reference's
# fixed slicing (role = first 3 ids) meaningful, plus a few common English pairs.
_TINY_MERGES: tuple[tuple[str, str], ...] = (
    ("a", "s"),
    ("as", "s"),
    ("i", "s"),
    ("ass", "is"),
    ("a", "n"),
    ("an", "t"),
    ("t", "ant"),
    ("assis", "tant"),
    ("u", "s"),
    ("e", "r"),
    ("us", "er"),
    ("Ġ", "t"),
    ("h", "e"),
    ("Ġt", "he"),
    ("i", "n"),
    ("o", "n"),
    ("l", "l"),
    ("Ġ", "w"),
)


def write_tiny_tokenizer(out_dir: Path) -> None:
    """Write ``vocab.json``, ``merges.txt`` and ``tokenizer_config.json`` of the tiny byte-level BPE.

    The 256 byte symbols take ids 0..255, merged symbols follow, and the special tokens sit at their real
    Qwen ids (151643...) inside ``vocab.json`` as well, so both our loader and transformers' Qwen2 tokenizer
    resolve them to the same ids despite the sparse vocabulary.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    vocab: dict[str, int] = {sym: i for i, sym in enumerate(byte_symbols())}
    for left, right in _TINY_MERGES:
        if left not in vocab or right not in vocab:
            raise ValueError(f"tiny merge ({left!r}, {right!r}) uses a symbol that is not defined yet")
        vocab.setdefault(left + right, len(vocab))
    for tid, content in SPECIAL_TOKENS.items():
        vocab[content] = tid
    (out_dir / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False, indent=0), encoding="utf-8")
    merges = "#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in _TINY_MERGES)
    (out_dir / "merges.txt").write_text(merges, encoding="utf-8")
    added = {
        str(tid): {
            "content": content,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": tid not in _NON_SPECIAL,
        }
        for tid, content in SPECIAL_TOKENS.items()
    }
    config = {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": added,
        "bos_token": None,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": 131072,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
