"""The PersonaPlex text tokenizer (SentencePiece ``tokenizer_spm_32k_3.model``): persona prompts in, the
agent's text tokens out as transcript pieces."""

from __future__ import annotations

import io
from pathlib import Path

import sentencepiece as spm

from voxstage.checkpoint import CheckpointError

from .config import TEXT_EPAD, TEXT_PAD

# Training text for the tiny preset's tokenizer (the real one has 32000 pieces; the tiny LM's text vocabulary
# is small, so its tokenizer must be too).
_TINY_CORPUS = (
    "<system> You enjoy having a good conversation. Your name is Jane. <system>",
    "<system> You are a wise and friendly teacher. Answer in a clear and engaging way. <system>",
    "Hello there, how can I help you today? I am happy to talk about technology and the weather.",
    "The quick brown fox jumps over the lazy dog while we speak and listen at the same time.",
    "Thanks for calling. Please tell me what you need, and I will do my best to help.",
)
TINY_VOCAB = 128


def wrap_system(text: str) -> str:
    """The persona as the model was trained to read it: ``"<system> {text} <system>"`` (kept if the caller
    already wrapped it)."""
    cleaned = text.strip()
    if cleaned.startswith("<system>") and cleaned.endswith("<system>"):
        return cleaned
    return f"<system> {cleaned} <system>"


class PersonaTokenizer:
    def __init__(self, model_proto: bytes, *, source: str = "tokenizer") -> None:
        try:
            self._sp = spm.SentencePieceProcessor(model_proto=model_proto)
        except (RuntimeError, OSError) as exc:
            raise CheckpointError(f"{source} is not a SentencePiece model: {exc}") from exc

    @classmethod
    def from_file(cls, path: Path) -> PersonaTokenizer:
        if not path.is_file():
            raise CheckpointError(f"missing text tokenizer {path}")
        return cls(path.read_bytes(), source=str(path))

    @property
    def vocab_size(self) -> int:
        return int(self._sp.get_piece_size())

    def encode_persona(self, text: str) -> list[int]:
        return [int(i) for i in self._sp.encode(wrap_system(text))]

    def piece(self, token: int) -> str:
        """Transcript text of one agent text token; padding tokens (and ids outside the vocabulary, which a
        random-weight model can emit) give nothing."""
        if token in (TEXT_EPAD, TEXT_PAD) or not 0 <= token < self.vocab_size:
            return ""
        if self._sp.is_control(token) or self._sp.is_unknown(token):
            return ""
        return str(self._sp.id_to_piece(token)).replace("\u2581", " ")


def tiny_tokenizer_model() -> bytes:
    """A deterministic SentencePiece model small enough for the tiny preset (same input, same bytes)."""
    out = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(_TINY_CORPUS * 8),
        model_writer=out,
        vocab_size=TINY_VOCAB,
        model_type="bpe",
        character_coverage=1.0,
        normalization_rule_name="identity",
        num_threads=1,
        unk_id=0,
        bos_id=1,
        eos_id=2,
        pad_id=3,
        hard_vocab_limit=False,
        minloglevel=2,
    )
    return out.getvalue()
