"""Prompt construction for Audio8 TTS (arktts), as the reference processor builds it (models.md §2.4).

The model input is ``[1 + 10, T]``: row 0 holds token ids, rows 1..10 the 10 codes of a frame (0 at text
positions). An ``Audio8Prompt`` keeps the two parts as ``ids [T]`` and ``codes [T, 10]``.

Segments are encoded one at a time with ``add_special_tokens=False``; template segments verbatim, request
text cleaned (strip, whitespace runs collapsed to one space) and checked (``<|speaker:N|>`` tags only):

* plain TTS: ``<|im_start|>system\\n`` | ``convert the provided text to speech`` | ``<|im_end|>\\n`` |
  ``<|im_start|>user\\n`` | TEXT | ``<|im_end|>\\n`` | ``<|im_start|>assistant\\n<|voice|>``;
* voice clone: ``<|im_start|>system\\n`` |
  ``convert the provided text to speech reference to the following:\\n\\nText:\\n`` |
  ``<|speaker:0|>`` REF_TEXT (no tag added when REF_TEXT already carries a ``<|speaker:N|>`` tag, as in
  the reference) | ``\\n\\nSpeech:\\n`` | one ``<|semantic:c0|>`` per reference frame, all 10 codes in the
  code rows | then the plain-TTS suffix from ``<|im_end|>\\n`` on.

Generated frames follow the prompt in the same ``max_seq_len`` (2048) positions; the reference refuses a
prompt that leaves no room for one frame, and so do we (``check_prompt_length``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from .tokenizer import Audio8Tokenizer, clean_text

NUM_CODEBOOKS = 10
CODEBOOK_SIZE = 4096  # every row of ref_codes is checked against it (the residual codec clamps at 1024)
MAX_SEQ_LEN = 2048

SYSTEM_HEADER = "<|im_start|>system\n"
SYSTEM_TTS = "convert the provided text to speech"
SYSTEM_CLONE = "convert the provided text to speech reference to the following:\n\nText:\n"
SPEECH_HEADER = "\n\nSpeech:\n"
TURN_END = "<|im_end|>\n"
USER_HEADER = "<|im_start|>user\n"
ASSISTANT_VOICE = "<|im_start|>assistant\n<|voice|>"

_HAS_SPEAKER_TAG = re.compile(r"<\|speaker:\d+\|>")


@dataclass(frozen=True)
class Audio8Prompt:
    """One request's prompt: ``ids [T]`` (row 0) and ``codes [T, 10]`` (rows 1..10), both int64.

    Reference-audio positions are ``[ref_start, ref_start + ref_frames)``: there ``ids`` is
    ``semantic_begin_id + code0`` and ``codes`` the frame's 10 codes; everywhere else ``codes`` is 0.
    """

    ids: np.ndarray
    codes: np.ndarray
    text_chars: int  # characters of the cleaned text to speak (for error messages)
    ref_start: int = 0
    ref_frames: int = 0

    def __post_init__(self) -> None:
        if self.ids.ndim != 1 or self.codes.shape != (self.ids.shape[0], NUM_CODEBOOKS):
            raise ValueError(f"Audio8Prompt: ids [T] and codes [T, {NUM_CODEBOOKS}] disagree")

    def __len__(self) -> int:
        return int(self.ids.shape[0])

    @property
    def length(self) -> int:
        """Prompt positions (the prefill length)."""
        return len(self)

    def span(self, start: int = 0, end: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """``(ids [n], codes [n, 10])`` of positions ``[start, end)`` (views, for chunked prefill)."""
        return self.ids[start:end], self.codes[start:end]

    def rows(self) -> np.ndarray:
        """The model-input layout ``[1 + 10, T]``: row 0 ids, rows 1..10 codes."""
        return np.concatenate([self.ids[None, :], self.codes.T], axis=0)

    def semantic_mask(self) -> np.ndarray:
        """``[T]`` bool: the positions whose codebook embeddings are added (the reference frames)."""
        mask = np.zeros(len(self), dtype=bool)
        mask[self.ref_start : self.ref_start + self.ref_frames] = True
        return mask

    def max_new_frames(self, max_seq_len: int = MAX_SEQ_LEN) -> int:
        """Frames that fit after the prompt (prompt + frames stop at ``max_seq_len`` positions)."""
        return max(max_seq_len - len(self), 0)


def validate_ref_codes(ref_codes: object) -> np.ndarray:
    """``ref_codes`` as int64 ``[T_ref >= 1, 10]``, every code in ``[0, 4096)``; ``ValueError`` names it."""
    arr = np.asarray(ref_codes)
    if arr.dtype == np.bool_ or not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"ref_codes: expected integer codes, got dtype {arr.dtype}")
    if arr.ndim != 2 or arr.shape[1] != NUM_CODEBOOKS or arr.shape[0] < 1:
        raise ValueError(f"ref_codes: expected shape [T_ref >= 1, {NUM_CODEBOOKS}], got {list(arr.shape)}")
    if arr.size and (int(arr.min()) < 0 or int(arr.max()) >= CODEBOOK_SIZE):
        bad = np.argwhere((arr < 0) | (arr >= CODEBOOK_SIZE))[0]
        frame, book = int(bad[0]), int(bad[1])
        which = "semantic code (codebook 0)" if book == 0 else f"residual code (codebook {book})"
        raise ValueError(
            f"ref_codes: the {which} of frame {frame} is {int(arr[frame, book])}, "
            f"outside [0, {CODEBOOK_SIZE})"
        )
    return arr.astype(np.int64, copy=False)


def check_prompt_length(
    length: int,
    *,
    text_chars: int,
    ref_frames: int = 0,
    max_seq_len: int = MAX_SEQ_LEN,
    min_new_frames: int = 1,
    text_field: str = "text",
) -> None:
    """Refuse a prompt of ``length`` positions that leaves fewer than ``min_new_frames`` under
    ``max_seq_len``; the message names the text length (and the reference length, if any)."""
    if length + min_new_frames <= max_seq_len:
        return
    ref = f" and {ref_frames} reference frames" if ref_frames else ""
    raise ValueError(
        f"{text_field}: the prompt for a text of {text_chars} characters{ref} takes {length} of the model's "
        f"{max_seq_len} positions, leaving no room for {min_new_frames} audio frame(s); shorten the text"
        + (" or the reference" if ref_frames else "")
    )


def build_prompt(
    tok: Audio8Tokenizer,
    text: str,
    *,
    ref_text: str | None = None,
    ref_codes: object | None = None,
    text_field: str = "text",
    max_seq_len: int = MAX_SEQ_LEN,
    min_new_frames: int = 1,
) -> Audio8Prompt:
    """The prompt for ``text`` (plain TTS), or a voice clone when ``ref_text`` and ``ref_codes`` are given.

    ``ref_codes`` is ``[T_ref, 10]`` (the codec stage's encoding of the reference audio).
    ``text_field`` is the request field that carried ``text`` (``text`` or ``input``), used in errors.
    """
    if not isinstance(text, str):
        raise ValueError(f"{text_field}: expected a string")
    cleaned = clean_text(text)
    if not cleaned:
        raise ValueError(f"{text_field}: the text to speak must not be empty")
    text_ids = tok.encode_user_text(cleaned, field=text_field)

    clone = ref_text is not None or ref_codes is not None
    parts: list[list[int]] = []
    ref_start = 0
    codes_ref: np.ndarray | None = None
    if clone:
        if ref_codes is None:
            raise ValueError("ref_codes: a voice clone needs the reference audio's codes as well as ref_text")
        if ref_text is None or not clean_text(ref_text):
            raise ValueError("ref_text: a voice clone needs the transcript of the reference audio")
        codes_ref = validate_ref_codes(ref_codes)
        ref_clean = clean_text(ref_text)
        ref_ids = tok.encode_user_text(ref_clean, field="ref_text")
        if not _HAS_SPEAKER_TAG.search(ref_clean):
            ref_ids = [tok.speaker_id(0), *ref_ids]
        parts += [
            tok.encode_raw(SYSTEM_HEADER),
            tok.encode_raw(SYSTEM_CLONE),
            ref_ids,
            tok.encode_raw(SPEECH_HEADER),
        ]
        ref_start = sum(len(p) for p in parts)
        parts.append((codes_ref[:, 0] + tok.ids.semantic_begin).tolist())
    else:
        parts += [tok.encode_raw(SYSTEM_HEADER), tok.encode_raw(SYSTEM_TTS)]
    parts += [
        tok.encode_raw(TURN_END),
        tok.encode_raw(USER_HEADER),
        text_ids,
        tok.encode_raw(TURN_END),
        tok.encode_raw(ASSISTANT_VOICE),
    ]
    ids = np.fromiter((i for p in parts for i in p), dtype=np.int64)
    codes = np.zeros((ids.shape[0], NUM_CODEBOOKS), dtype=np.int64)
    ref_frames = 0
    if codes_ref is not None:
        ref_frames = codes_ref.shape[0]
        codes[ref_start : ref_start + ref_frames] = codes_ref
    check_prompt_length(
        int(ids.shape[0]),
        text_chars=len(cleaned),
        ref_frames=ref_frames,
        max_seq_len=max_seq_len,
        min_new_frames=min_new_frames,
        text_field=text_field,
    )
    return Audio8Prompt(
        ids=ids, codes=codes, text_chars=len(cleaned), ref_start=ref_start, ref_frames=ref_frames
    )
