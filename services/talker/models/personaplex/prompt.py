"""PersonaPlex's system-prompt phases, turned into the token columns the LM is prefilled with.

NVIDIA's server (the ``moshi-personaplex`` fork; not in PyPI moshi) runs four phases before live audio,
one frame per step, with the user channel held at ``SINE_TOKENS`` throughout:

1. the voice prompt: agent codebooks forced to the Mimi codes of the voice WAV (loudness-normalised to
   -24 LUFS by the codec stage), text forced to PAD; or, with a ``voices/*.pt`` file, its stored input
   embeddings are replayed and its token cache restored;
2. 0.5 s (6 frames) of agent ``SILENCE_TOKENS`` with text PAD;
3. the persona text ``"<system> {prompt} <system>"`` (SentencePiece ids), one id per frame on the text
   channel, agent silence;
4. 0.5 s of silence again.

Every prompt token is forced, so no sampling happens until the prompt ends: the whole prompt is known in
advance and is **prefilled** in chunks, not stepped frame by frame. This module computes the input column
of every prompt position exactly as the fork's forcing produces them (their ``provided`` cache):

- column 0 is all initial tokens, and column 1's delayed codebooks are initial: the first prompt frame
  only ever lands where the initial tokens overwrite it;
- column c >= 1 holds frame c's text and codebook 0 (agent and user) and frame c-1's delayed codebooks 1..7.

The last column is not prefilled: it is the slot's first decode input, and the last frame's delayed agent
codebooks are forced on that first free step (``first_forced``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from .config import AGENT_STREAMS, TEXT_PAD, LMConfig

SILENCE_TOKENS = (948, 243, 1178, 546, 1736, 1030, 1978, 2008)
SINE_TOKENS = (430, 1268, 381, 1611, 1095, 1495, 56, 472)
SILENCE_FRAMES = 6  # int(0.5 s * 12.5 Hz), each side of the persona text


class PromptError(ValueError):
    """A voice or persona that cannot become a prompt; the message names the field."""


@dataclass(frozen=True)
class VoiceEmbeddings:
    """A ``voices/*.pt`` voice: the LM input embeddings of the voice prompt's steps and the fork's token
    cache after them (``[17, CT]``, column c at index ``c % CT``)."""

    embeddings: torch.Tensor  # [E, dim]
    cache: np.ndarray  # [17, CT] int64


@dataclass(frozen=True)
class Prompt:
    """Prefill inputs of one session: ``embeddings`` for positions ``[0, E)`` (a replayed voice), then
    ``columns`` for the rest; the last column is the first decode input."""

    embeddings: torch.Tensor | None  # [E, dim]
    columns: np.ndarray  # [C, 17] int64, C >= 1
    first_forced: np.ndarray  # [7] int64: agent codebooks 1..7 forced on the first free step
    first_user: np.ndarray  # [8] int64: the user frame of the first free step

    @property
    def num_embedded(self) -> int:
        return 0 if self.embeddings is None else int(self.embeddings.shape[0])

    @property
    def length(self) -> int:
        return self.num_embedded + int(self.columns.shape[0])


@dataclass(frozen=True)
class _Frame:
    text: int
    agent: tuple[int, ...]
    user: tuple[int, ...]


class _Columns:
    """Accumulates columns from frames, carrying the delayed codebooks into the next column."""

    def __init__(self, config: LMConfig) -> None:
        self.rows = config.num_codebooks
        self.columns: list[np.ndarray] = []
        initial = [config.text_initial] + [config.audio_initial] * config.n_q
        self.columns.append(np.asarray(initial, np.int64))
        self.pending_agent = np.full(AGENT_STREAMS - 1, config.audio_initial, np.int64)
        self.pending_user = np.full(AGENT_STREAMS - 1, config.audio_initial, np.int64)

    def restore(self, cache: np.ndarray, position: int) -> None:
        """Continue after ``position`` replayed columns: column ``position`` and the delayed codebooks of the
        one after come from the fork's saved cache."""
        ct = cache.shape[1]
        self.columns = [cache[:, position % ct].astype(np.int64)]
        after = cache[:, (position + 1) % ct]
        self.pending_agent = after[2 : 1 + AGENT_STREAMS].astype(np.int64)
        self.pending_user = after[2 + AGENT_STREAMS :].astype(np.int64)

    def push(self, frame: _Frame) -> None:
        col = np.empty(self.rows, np.int64)
        col[0] = frame.text
        col[1] = frame.agent[0]
        col[2 : 1 + AGENT_STREAMS] = self.pending_agent
        col[1 + AGENT_STREAMS] = frame.user[0]
        col[2 + AGENT_STREAMS :] = self.pending_user
        self.columns.append(col)
        self.pending_agent = np.asarray(frame.agent[1:], np.int64)
        self.pending_user = np.asarray(frame.user[1:], np.int64)


def build_prompt(
    config: LMConfig,
    *,
    voice_codes: np.ndarray | None = None,
    voice: VoiceEmbeddings | None = None,
    text_ids: Sequence[int] = (),
    silence_frames: int = SILENCE_FRAMES,
) -> Prompt:
    """The prompt of one session: a voice (Mimi codes ``[N, 8]`` or stored embeddings, or none), the
    persona's text ids (already wrapped in ``<system>`` tags and tokenized), silence around them."""
    if voice_codes is not None and voice is not None:
        raise PromptError("voice: give either voice codes or a stored voice, not both")
    acc = _Columns(config)
    frames: list[_Frame] = []
    embeddings = None
    sine = SINE_TOKENS
    if voice is not None:
        embeddings = _check_embeddings(voice, config)
        acc.restore(voice.cache, int(embeddings.shape[0]))
    elif voice_codes is not None:
        codes = _check_codes(voice_codes, config)
        frames += [_Frame(TEXT_PAD, tuple(int(c) for c in row), sine) for row in codes]
    silence = [_Frame(TEXT_PAD, SILENCE_TOKENS, sine)] * silence_frames
    for t in text_ids:
        if not 0 <= int(t) < config.text_card:
            raise PromptError(f"persona: token id {t} is outside the text vocabulary [0, {config.text_card})")
    frames += silence + [_Frame(int(t), SILENCE_TOKENS, sine) for t in text_ids] + silence
    # The first frame of a token prompt lands only under column 0's initial tokens (see module docstring).
    for frame in frames[0 if voice is not None else 1 :]:
        acc.push(frame)
    columns = np.stack(acc.columns)
    first_user = np.concatenate(([columns[-1, 1 + AGENT_STREAMS]], acc.pending_user)).astype(np.int64)
    return Prompt(embeddings, columns, acc.pending_agent.copy(), first_user)


def _check_codes(codes: np.ndarray, config: LMConfig) -> np.ndarray:
    codes = np.asarray(codes)
    if codes.ndim != 2 or codes.shape[1] != AGENT_STREAMS or not np.issubdtype(codes.dtype, np.integer):
        raise PromptError(
            f"voice: codes must be integers of shape [frames, {AGENT_STREAMS}], got {codes.shape}"
        )
    if codes.size and (codes.min() < 0 or codes.max() >= config.card):
        raise PromptError(f"voice: codes must lie in [0, {config.card})")
    return codes.astype(np.int64)


def _check_embeddings(voice: VoiceEmbeddings, config: LMConfig) -> torch.Tensor:
    emb = voice.embeddings
    if emb.ndim != 2 or emb.shape[1] != config.dim or emb.shape[0] < 1:
        raise PromptError(f"voice: embeddings must be [steps, {config.dim}], got {tuple(emb.shape)}")
    cache = voice.cache
    if cache.ndim != 2 or cache.shape[0] != config.num_codebooks or cache.shape[1] < 2:
        raise PromptError(f"voice: token cache must be [{config.num_codebooks}, columns], got {cache.shape}")
    return emb
