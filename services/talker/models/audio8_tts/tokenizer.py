"""Audio8 TTS (arktts) text tokenizer: the checkpoint's ``tokenizer.json`` plus the family's special tokens.

The released checkpoint ships a PreTrainedTokenizerFast file (a Qwen2 byte-level BPE); it is loaded as is
with ``tokenizers.Tokenizer``. The special tokens the prompt and the sampler rely on are looked up by
content and checked against ``config.json`` (models.md §2.2):

* ``<|endoftext|>`` pad (151643), ``<|im_start|>``, ``<|im_end|>`` = eos (151645), ``<|voice|>``;
* ``<|speaker:N|>`` tags, as many as the file declares;
* ``<|semantic:N|>`` for N in 0..4095 at ``semantic_begin_id + N`` (151678..155773).

Text that comes from a request is cleaned the way the reference processor cleans it (strip, then every
whitespace run becomes one space) and encoded with ``add_special_tokens=False``; special-token strings
inside it are recognised by the tokenizer, so user text is checked first: ``<|speaker:N|>`` tags are
allowed, any other ``<|...|>`` tag is refused with a ``ValueError`` naming the request field.

``tiny_tokenizer_json()`` builds a small but real byte-level BPE for the tiny preset whose special tokens
sit at the real ids, so prompts built with it carry the real special ids and ``vocab_size`` 155776 holds.
"""

from __future__ import annotations

import functools
import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Tokenizer

from voxstage.checkpoint import CheckpointError, read_json

from ..qwen3_tts.tokenizer import BackedTokenizer, byte_symbols, qwen2_bpe, qwen2_pre_tokenizer

ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
VOICE = "<|voice|>"

# Released values (config.json, models.md §2.2); a checkpoint's own config.json is checked against the file.
SEMANTIC_BEGIN_ID = 151678
SEMANTIC_END_ID = 155773
EOS_TOKEN_ID = 151645
PAD_TOKEN_ID = 151643
NUM_SEMANTIC = 4096

_SPEAKER_RE = re.compile(r"<\|speaker:(\d+)\|>")
_SEMANTIC_RE = re.compile(r"<\|semantic:(\d+)\|>")
# A special-token-shaped tag in request text (no whitespace or pipe inside, as in every special token).
_TAG_RE = re.compile(r"<\|[^|\s]*\|>")


def speaker_token(n: int) -> str:
    return f"<|speaker:{n}|>"


def semantic_token(n: int) -> str:
    return f"<|semantic:{n}|>"


def clean_text(text: str) -> str:
    """The reference processor's cleaning: strip, then collapse every whitespace run to one space."""
    return " ".join(str(text).split())


@dataclass(frozen=True)
class Audio8SpecialIds:
    pad: int  # <|endoftext|>
    im_start: int
    im_end: int  # = eos
    voice: int
    semantic_begin: int  # <|semantic:0|>
    semantic_end: int  # <|semantic:N-1|> (inclusive)
    speakers: tuple[int, ...]  # <|speaker:0..|> ids, index = N (contiguous from 0)

    @property
    def eos(self) -> int:
        return self.im_end

    @property
    def num_semantic(self) -> int:
        return self.semantic_end - self.semantic_begin + 1

    def is_semantic(self, token_id: int) -> bool:
        return self.semantic_begin <= token_id <= self.semantic_end


class Audio8Tokenizer(BackedTokenizer):
    """The checkpoint's byte-level BPE and the ids of the arktts special tokens (``decode``, ``token_id``
    and ``backend`` come from ``BackedTokenizer``)."""

    def __init__(self, tokenizer: Tokenizer, ids: Audio8SpecialIds) -> None:
        super().__init__(tokenizer)
        self.ids = ids
        self._speaker_by_content = {speaker_token(n): tid for n, tid in enumerate(ids.speakers)}
        self._control_ids = frozenset({ids.pad, ids.im_start, ids.im_end, ids.voice})

    # ---- construction ----------------------------------------------------------------------------
    @classmethod
    def from_dir(cls, directory: Path | str) -> Audio8Tokenizer:
        """Load ``tokenizer.json`` and check its special ids against ``config.json`` in ``directory``."""
        directory = Path(directory)
        path = directory / "tokenizer.json"
        if not path.is_file():
            raise CheckpointError(f"missing file {path}")
        try:
            tok = Tokenizer.from_file(str(path))
        except Exception as exc:  # tokenizers raises a plain Exception on malformed files
            raise CheckpointError(f"{path} is not a valid tokenizers file: {exc}") from exc
        config_path = directory / "config.json"
        return cls._checked(tok, read_json(config_path), source=str(path), config_source=str(config_path))

    @classmethod
    def from_json_str(
        cls, text: str, config: Mapping[str, Any] | None = None, *, source: str = "tokenizer.json"
    ) -> Audio8Tokenizer:
        """Build from a ``tokenizer.json`` string; ``config`` (default: the released values) is checked."""
        try:
            tok = Tokenizer.from_str(text)
        except Exception as exc:
            raise CheckpointError(f"{source} is not a valid tokenizers file: {exc}") from exc
        return cls._checked(tok, config or {}, source=source, config_source="config")

    @classmethod
    def tiny(cls) -> Audio8Tokenizer:
        """The tiny preset's tokenizer (``tiny_tokenizer_json()``) with the released config ids."""
        return cls.from_json_str(tiny_tokenizer_json(), source="tiny tokenizer.json")

    @classmethod
    def _checked(
        cls, tok: Tokenizer, config: Mapping[str, Any], *, source: str, config_source: str
    ) -> Audio8Tokenizer:
        def config_int(key: str, default: int) -> int:
            value = config.get(key, default)
            if isinstance(value, bool) or not isinstance(value, int):
                raise CheckpointError(f"{config_source}: {key} must be an integer, got {value!r}")
            return value

        def required(content: str) -> int:
            tid = tok.token_to_id(content)
            if tid is None:
                raise CheckpointError(f"{source}: the special token {content!r} is missing")
            if tok.encode(content, add_special_tokens=False).ids != [tid]:
                raise CheckpointError(f"{source}: {content!r} is not recognised as one added token in text")
            return tid

        pad, im_start, im_end, voice = (required(c) for c in (ENDOFTEXT, IM_START, IM_END, VOICE))

        # Semantic tokens: <|semantic:0..N-1|> contiguous from semantic_begin_id.
        added = {tok_.content: tid for tid, tok_ in tok.get_added_tokens_decoder().items()}
        semantic = sorted(
            (int(m.group(1)), tid) for content, tid in added.items() if (m := _SEMANTIC_RE.fullmatch(content))
        )
        if not semantic:
            raise CheckpointError(f"{source}: no <|semantic:N|> tokens")
        count = len(semantic)
        begin = semantic[0][1]
        for n, (code, tid) in enumerate(semantic):
            if code != n or tid != begin + n:
                raise CheckpointError(
                    f"{source}: <|semantic:N|> tokens must be N = 0..{count - 1} at consecutive ids from "
                    f"{begin}; found <|semantic:{code}|> at {tid}"
                )
        end = begin + count - 1
        for key, got, default in (
            ("semantic_begin_id", begin, SEMANTIC_BEGIN_ID),
            ("semantic_end_id", end, SEMANTIC_END_ID),
            ("eos_token_id", im_end, EOS_TOKEN_ID),
            ("pad_token_id", pad, PAD_TOKEN_ID),
        ):
            want = config_int(key, default)
            if want != got:
                what = {
                    "semantic_begin_id": "<|semantic:0|>",
                    "semantic_end_id": f"<|semantic:{count - 1}|>",
                    "eos_token_id": IM_END,
                    "pad_token_id": ENDOFTEXT,
                }[key]
                raise CheckpointError(f"{config_source}: {key} is {want} but {source} has {what} at {got}")
        codebook = config_int("codebook_size", NUM_SEMANTIC)
        if count != codebook:
            raise CheckpointError(
                f"{source}: {count} <|semantic:N|> tokens but {config_source} codebook_size is {codebook}"
            )
        if "vocab_size" in config and end >= (vocab_size := config_int("vocab_size", 0)):
            raise CheckpointError(f"{config_source}: vocab_size {vocab_size} does not cover the semantic ids")

        speakers = sorted(
            (int(m.group(1)), tid) for content, tid in added.items() if (m := _SPEAKER_RE.fullmatch(content))
        )
        if [n for n, _ in speakers] != list(range(len(speakers))):
            raise CheckpointError(f"{source}: <|speaker:N|> tokens must be numbered 0, 1, 2, ... (no gaps)")
        if not speakers:
            raise CheckpointError(f"{source}: the special token '<|speaker:0|>' is missing")
        ids = Audio8SpecialIds(
            pad=pad,
            im_start=im_start,
            im_end=im_end,
            voice=voice,
            semantic_begin=begin,
            semantic_end=end,
            speakers=tuple(tid for _, tid in speakers),
        )
        return cls(tok, ids)

    # ---- encoding ----------------------------------------------------------------------------------
    def encode_raw(self, text: str) -> list[int]:
        """Ids of ``text`` verbatim (template strings): no cleaning, special tokens recognised."""
        return list(self._tok.encode(text, add_special_tokens=False).ids)

    def encode_segment(self, text: str) -> list[int]:
        """Ids of ``clean_text(text)``, ``add_special_tokens=False``, special tokens recognised."""
        return self.encode_raw(clean_text(text))

    def encode_user_text(self, text: str, *, field: str = "text") -> list[int]:
        """``encode_segment`` for request text, after refusing control tags (``ValueError`` naming ``field``).

        ``<|speaker:N|>`` tags of speakers the tokenizer knows are allowed; any other ``<|...|>`` tag
        (``<|im_start|>``, ``<|voice|>``, ``<|semantic:N|>``, unknown speakers, ...) is refused.
        """
        cleaned = clean_text(text)
        for m in _TAG_RE.finditer(cleaned):
            tag = m.group(0)
            if _SPEAKER_RE.fullmatch(tag):
                if tag not in self._speaker_by_content:
                    raise ValueError(
                        f"{field}: unknown speaker tag {tag}; this checkpoint has <|speaker:0|>.."
                        f"<|speaker:{len(self.ids.speakers) - 1}|>"
                    )
                continue
            raise ValueError(f"{field}: the tag {tag} is not allowed in request text (only <|speaker:N|>)")
        ids = self.encode_raw(cleaned)
        for tid in ids:  # a control token that slipped past the tag pattern
            if tid in self._control_ids or self.ids.is_semantic(tid):
                raise ValueError(f"{field}: the text contains the control token {self.decode([tid])!r}")
        return ids

    def speaker_id(self, n: int) -> int:
        if not 0 <= n < len(self.ids.speakers):
            last = len(self.ids.speakers) - 1
            raise ValueError(f"speaker: {n} is out of range; this checkpoint has speakers 0..{last}")
        return self.ids.speakers[n]

    def semantic_id(self, code: int) -> int:
        if not 0 <= code < self.ids.num_semantic:
            raise ValueError(f"semantic code {code} is outside [0, {self.ids.num_semantic})")
        return self.ids.semantic_begin + code


# ---- tiny tokenizer for tests and the tiny preset ---------------------------------------------------
# Special-token layout of the tiny file. The released ids are fixed for <|endoftext|> (151643), <|im_start|>
# (151644), <|im_end|> (151645) and <|semantic:0..4095|> (151678..155773); we place <|voice|> at 151646 and
# <|speaker:0..30|> at 151647..151677, filling the gap between them exactly.
TINY_VOICE_ID = 151646
TINY_SPEAKER_BASE_ID = 151647
TINY_NUM_SPEAKERS = SEMANTIC_BEGIN_ID - TINY_SPEAKER_BASE_ID  # 31


def tiny_special_tokens() -> dict[int, str]:
    """id -> content of every special token of the tiny tokenizer (ascending ids 151643..155773)."""
    out = {PAD_TOKEN_ID: ENDOFTEXT, PAD_TOKEN_ID + 1: IM_START, EOS_TOKEN_ID: IM_END, TINY_VOICE_ID: VOICE}
    out.update({TINY_SPEAKER_BASE_ID + n: speaker_token(n) for n in range(TINY_NUM_SPEAKERS)})
    out.update({SEMANTIC_BEGIN_ID + n: semantic_token(n) for n in range(NUM_SEMANTIC)})
    return out


# Training text of the tiny BPE: the prompt template (so its words become single tokens) and some plain
# English, repeated by weight. Changing it changes the tiny tokenizer, so keep it fixed.
_TINY_CORPUS: tuple[tuple[str, int], ...] = (
    ("system\nconvert the provided text to speech reference to the following:\n\nText:\n", 12),
    ("\n\nSpeech:\nuser\nassistant\n", 12),
    (
        "The quick brown fox jumps over the lazy dog. Hello there, how are you today? "
        "This is a small test of the speech model: it reads the text and speaks it out loud. "
        "We are going to the station in the morning, and then we will take the train home. "
        "Please say the number one, two, three, four, five, six, seven, eight, nine and ten. "
        "It's a sunny day; the weather is nice and warm, so let's walk along the river together. "
        "What time is it? I don't know, but I think that it should be about four in the afternoon.",
        3,
    ),
)
TINY_MAX_MERGES = 320  # the corpus runs out of repeated pairs first (253 merges)


def _learn_merges(num_merges: int) -> list[tuple[str, str]]:
    """A plain, deterministic BPE learner over the byte-level pre-tokens of ``_TINY_CORPUS``.

    Each round merges the most frequent adjacent pair (ties: the lexicographically smallest pair), until
    ``num_merges`` merges or no pair occurs twice.
    """
    split = qwen2_pre_tokenizer()
    freq: Counter[str] = Counter()
    for text, weight in _TINY_CORPUS:
        for piece, _ in split.pre_tokenize_str(text):
            freq[piece] += weight
    words = [(list(w), n) for w, n in sorted(freq.items())]
    merges: list[tuple[str, str]] = []
    while len(merges) < num_merges:
        pairs: Counter[tuple[str, str]] = Counter()
        for symbols, n in words:
            for pair in zip(symbols, symbols[1:], strict=False):
                pairs[pair] += n
        if not pairs:
            break
        best_count = max(pairs.values())
        if best_count < 2:
            break
        best = min(p for p, c in pairs.items() if c == best_count)
        merges.append(best)
        joined = best[0] + best[1]
        for symbols, _ in words:
            i = 0
            while i < len(symbols) - 1:
                if symbols[i] == best[0] and symbols[i + 1] == best[1]:
                    symbols[i : i + 2] = [joined]
                i += 1
    return merges


@functools.lru_cache(maxsize=1)
def tiny_tokenizer_json() -> str:
    """A ``tokenizer.json`` (tokenizers format) of a small byte-level BPE with the arktts special tokens.

    Byte symbols take ids 0..255, the learned merges follow, and the special tokens of
    ``tiny_special_tokens()`` sit at their ids inside the (sparse) model vocabulary as well as in
    ``added_tokens``: ``tokenizers`` would otherwise renumber added tokens from the end of the vocabulary.
    """
    vocab: dict[str, int] = {sym: i for i, sym in enumerate(byte_symbols())}
    merges = _learn_merges(TINY_MAX_MERGES)
    for left, right in merges:
        vocab.setdefault(left + right, len(vocab))
    specials = tiny_special_tokens()
    if len(vocab) > min(specials):
        raise AssertionError("the tiny BPE vocabulary overlaps the special-token ids")
    for tid, content in specials.items():
        vocab[content] = tid
    tok = qwen2_bpe(vocab, merges)
    tok.add_special_tokens(
        [
            AddedToken(content, special=True, normalized=False, lstrip=False, rstrip=False, single_word=False)
            for _, content in sorted(specials.items())
        ]
    )
    text = tok.to_str()
    check = Tokenizer.from_str(text)
    for tid, content in specials.items():
        if check.token_to_id(content) != tid:
            raise AssertionError(f"tiny tokenizer: {content!r} did not round-trip at id {tid}")
    return text


def write_tiny_tokenizer(out_dir: Path | str) -> Path:
    """Write the tiny ``tokenizer.json`` into ``out_dir`` (the preset writes ``config.json`` itself)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "tokenizer.json"
    path.write_text(tiny_tokenizer_json(), encoding="utf-8")
    return path


def released_config_ids() -> dict[str, int]:
    """The config.json fields the tokenizer is checked against, at their released values."""
    return {
        "semantic_begin_id": SEMANTIC_BEGIN_ID,
        "semantic_end_id": SEMANTIC_END_ID,
        "eos_token_id": EOS_TOKEN_ID,
        "pad_token_id": PAD_TOKEN_ID,
        "codebook_size": NUM_SEMANTIC,
    }
