"""The LLM-rate workload: each ``StreamingSynthesize`` call streams its text as small deltas at a fixed rate.

A client behind an LLM gets its text as the model writes it: word pieces at some tens of tokens per second.
:func:`llm_tokens` cuts an answer into such deltas (the tokenizer of tests/integration/test_segments.py: words
with their leading space in pieces of at most 4 characters, trailing punctuation as its own token; about 1.3
tokens per English word, as BPE vocabularies give). :class:`GrpcLlmClient` sends the config and then the
deltas on an absolute schedule (delta *i* at ``start + i / rate``), a ``flush`` right after every sentence
end (``.``, ``!``, ``?``), and half-closes after the last delta. Every flushed sentence is its own segment
server-side, so the response is one segment per sentence, contiguous in sample offsets: the loadgen's
playback simulation (a player started at the first chunk) covers the seams between segments unchanged.

**Fixed length.** ``max_frames`` applies per segment, and the server's ``min_tokens`` (EOS disabled, see
bench/README.md) is per take, so every segment runs to exactly its budget B whenever ``min_tokens >= B``.
:func:`segment_budget` picks ``B = ceil(frames / S)`` for S sentences: the answers in
``prompts/llm_answers.txt`` have 10 sentences each, so ``--frames 100`` gives 10 frames (0.8 s) per sentence
and 8.0 s per request, the whole-text mode's length, *if the server keeps one segment per sentence*. It does
not always: a segment starts early (``early_start_chars``, 16) and its take is paced by the text tokens it
has, one frame per token; the presets' byte-level tokenizer gives about one token per character, so a take
can reach B frames before its sentence is complete, and the talker then starts a new segment with the rest
of the sentence. The check is therefore ``frames == B x segments received`` (and ``segments >= sentences``);
records keep both counts, and a level's ``split_requests`` counts requests with more segments than
sentences. ``--segment-frames`` sets B outright (e.g. 80, above the longest sentence's 70 characters, so
none should be split: about 64 s of audio per request).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncIterator
from pathlib import Path

from bench.clients import Synthesis, _GrpcBase, synthesis_config
from bench.records import Outcome
from voxstage.v1 import speech_pb2

ANSWERS = Path(__file__).resolve().parent / "prompts" / "llm_answers.txt"
SENTENCE_ENDS = frozenset(".!?")
PUNCTUATION = ".,!?;:"
PIECE_CHARS = 4
Req = speech_pb2.StreamingSynthesizeRequest


def llm_tokens(text: str) -> list[str]:
    """Roughly LLM-sized deltas: words with their leading space cut into pieces of at most 4 characters,
    trailing punctuation one token per mark. ``"".join(llm_tokens(t)) == t`` for single-spaced text."""
    out: list[str] = []
    for i, word in enumerate(text.split(" ")):
        core = word.rstrip(PUNCTUATION)
        punct = word[len(core) :]
        core = ("" if i == 0 else " ") + core
        out += [core[k : k + PIECE_CHARS] for k in range(0, len(core), PIECE_CHARS)]
        out += list(punct)
    return out


def sentence_count(tokens: list[str]) -> int:
    """Segments the client will make: one per sentence-end token, plus a trailing unterminated part."""
    ends = [i for i, tok in enumerate(tokens) if tok in SENTENCE_ENDS]
    tail = bool(tokens) and (not ends or ends[-1] < len(tokens) - 1)
    return len(ends) + int(tail)


def segment_budget(frames: int, sentences: int) -> int:
    """Per-segment ``max_frames`` so that the whole answer is about ``frames`` frames (never fewer)."""
    return max(1, math.ceil(frames / max(1, sentences)))


def load_answers(path: Path = ANSWERS) -> list[str]:
    lines = [ln.strip() for ln in path.read_text(encoding="utf-8").splitlines()]
    answers = [ln for ln in lines if ln and not ln.startswith("#")]
    if not answers:
        raise SystemExit(f"{path}: no answers")
    return answers


class GrpcLlmClient(_GrpcBase):
    """``StreamingSynthesize`` fed like an LLM: deltas at ``tokens_per_s``, a flush per sentence."""

    api = "grpc-llm"

    def __init__(self, address: str, channels: int = 1, tokens_per_s: float = 30.0) -> None:
        if tokens_per_s <= 0:  # before any channel exists
            raise ValueError(f"tokens_per_s must be > 0, got {tokens_per_s}")
        super().__init__(address, channels)
        self.tokens_per_s = tokens_per_s

    async def _inputs(self, s: Synthesis, out: Outcome) -> AsyncIterator[Req]:
        tokens = llm_tokens(s.text)
        yield Req(config=synthesis_config(s))
        for i, token in enumerate(tokens):
            due = out.start + i / self.tokens_per_s  # absolute: a late wake-up does not shift the rest
            delay = due - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            now = time.perf_counter()
            out.send_lag_max_s = max(out.send_lag_max_s, now - due)
            if i == len(tokens) - 1:
                out.text_done = now  # the last delta is handed to the transport now
            yield Req(text=token)
            if token in SENTENCE_ENDS:
                yield Req(flush=speech_pb2.Flush())
        # The generator ends here: the call is half-closed, which also ends a trailing unflushed segment.

    async def run(self, s: Synthesis, timeout_s: float) -> Outcome:
        out = Outcome(start=time.perf_counter(), send_lag_max_s=0.0, segments=0)
        call = self.stub().StreamingSynthesize(self._inputs(s, out), timeout=timeout_s)
        return await self.read_stream(call, out, timeout_s)
