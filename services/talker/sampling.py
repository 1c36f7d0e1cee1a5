"""Batched, per-row token sampling with seeded, batch-invariant randomness (model-agnostic).

Each row carries its own temperature / top-k / top-p / repetition penalty; ``temperature <= 0`` means
greedy. Randomness is *counter based*: the noise for vocabulary entry ``v`` is a hash of
``(seed, step, stream, v)`` computed with integer tensor ops, turned into Gumbel noise, and the sample is
``argmax(scaled_logits + gumbel)`` (Gumbel-max, an exact draw from the softmax). A request therefore gets
the same random numbers whether it runs alone or batched, at any slot index, and there is no generator
state to carry, so the whole thing is CUDA-graph safe and never syncs with the host.

Processing order follows transformers' generate: repetition penalty, then the caller's bans
(``-inf``), then temperature, top-k, top-p; greedy rows take the argmax after penalty and bans only.
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Iterable
from dataclasses import dataclass

import torch

from services.talker.slot_writes import IMMEDIATE, ImmediateWrites

_M32 = 0xFFFFFFFF
# Odd multipliers below 2**31, so a 32-bit value times one stays below 2**63 in int64 arithmetic.
_MUL_A = 0x7FEB352D
_MUL_B = 0x5BD1E995
_GOLDEN = 0x1E3779B9
_STREAM_MUL = 0x2C1B3C6D


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """An avalanche integer hash of 32-bit values held in int64 tensors (lowbias32 shape)."""
    x = x ^ (x >> 16)
    x = (x * _MUL_A) & _M32
    x = x ^ (x >> 15)
    x = (x * _MUL_B) & _M32
    return x ^ (x >> 16)


def seed_keys(seed: torch.Tensor) -> torch.Tensor:
    """The seed's part of each row's key, ``[B]`` (what ``step_keys`` mixes its step into)."""
    seed = seed.to(torch.int64)
    return _mix32(_mix32((seed & _M32) ^ _GOLDEN) ^ ((seed >> 32) & _M32))


def _mix32_int(x: int) -> int:
    """``_mix32`` of one value in Python integers (the same bits)."""
    x ^= x >> 16
    x = (x * _MUL_A) & _M32
    x ^= x >> 15
    x = (x * _MUL_B) & _M32
    return x ^ (x >> 16)


def seed_key(seed: int) -> int:
    """``seed_keys`` of one int64 seed on the host: a slot's, written once at admission, so a frame step
    mixes in only its step (two of ``step_keys``' three hash rounds, some 20 launches, not repeated every
    frame)."""
    return _mix32_int(_mix32_int((seed & _M32) ^ _GOLDEN) ^ ((seed >> 32) & _M32))


def step_keys_from(seed_key: torch.Tensor, step: torch.Tensor) -> torch.Tensor:
    """``step_keys`` from the rows' ``seed_keys``."""
    return _mix32(seed_key ^ (step.to(torch.int64) & _M32))


def step_keys(seed: torch.Tensor, step: torch.Tensor) -> torch.Tensor:
    """The ``(seed, step)`` part of each row's key, ``[B]``: computed once for all of a step's streams."""
    return step_keys_from(seed_keys(seed), step)


def slot_noise(
    seed_key: torch.Tensor, step: torch.Tensor, stream: int | torch.Tensor, vocab_size: int
) -> torch.Tensor:
    """``gumbel_noise`` of rows from their slots' ``seed_key`` (``[B, V]``, or ``[B, S, V]`` for ``S``
    streams at once): the same numbers."""
    return gumbel_from_keys(stream_keys(step_keys_from(seed_key, step), stream), vocab_size)


def stream_keys(base: torch.Tensor, stream: int | torch.Tensor) -> torch.Tensor:
    """Row keys for one stream id (``[B]``) or for several at once (``stream [S]`` -> ``[B, S]``)."""
    if isinstance(stream, int):
        return _mix32(base ^ ((stream * _STREAM_MUL + _GOLDEN) & _M32))
    salt = (stream.to(torch.int64) * _STREAM_MUL + _GOLDEN) & _M32
    if salt.dim() == 0:
        return _mix32(base ^ salt)
    return _mix32(base.unsqueeze(-1) ^ salt.unsqueeze(0))


def row_keys(seed: torch.Tensor, step: torch.Tensor, stream: int | torch.Tensor) -> torch.Tensor:
    """One 32-bit key per row from its 64-bit ``seed``, its ``step`` counter and a ``stream`` id."""
    return stream_keys(step_keys(seed, step), stream)


@functools.lru_cache(maxsize=32)
def _column_keys(vocab_size: int, device: torch.device) -> torch.Tensor:
    col = torch.arange(vocab_size, device=device, dtype=torch.int64)
    return _mix32(((col * _MUL_A) & _M32) ^ _GOLDEN)


def unit_from_bits(bits: torch.Tensor) -> torch.Tensor:
    """32-bit hashes -> float32 strictly inside (0, 1).

    23 bits, not 24: ``(2**24 - 0.5) / 2**24`` rounds to exactly 1.0 in float32, whose Gumbel noise is +inf,
    and ``-inf`` (a banned token) + inf is NaN, which argmax picks. With 23 bits the largest value is
    ``1 - 2**-24`` and the smallest ``2**-24``.
    """
    return ((bits >> 9).to(torch.float32) + 0.5) * (1.0 / (1 << 23))


def uniform_from_keys(keys: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Uniforms in (0, 1), ``keys.shape + (V,)``, from row keys of any shape (one per key and column)."""
    return unit_from_bits(_mix32(keys.unsqueeze(-1) ^ _column_keys(vocab_size, keys.device)))


def gumbel_from_keys(keys: torch.Tensor, vocab_size: int) -> torch.Tensor:
    return -torch.log(-torch.log(uniform_from_keys(keys, vocab_size)))


def uniform_noise(
    seed: torch.Tensor, step: torch.Tensor, stream: int | torch.Tensor, vocab_size: int
) -> torch.Tensor:
    """``[B, V]`` uniforms in (0, 1) that depend only on each row's (seed, step, stream) and the column."""
    return uniform_from_keys(row_keys(seed, step, stream), vocab_size)


def gumbel_noise(
    seed: torch.Tensor, step: torch.Tensor, stream: int | torch.Tensor, vocab_size: int
) -> torch.Tensor:
    return gumbel_from_keys(row_keys(seed, step, stream), vocab_size)


@dataclass
class SamplingTensors:
    """Per-row sampling parameters as device tensors, each ``[B]`` (rows aligned with the logits)."""

    temperature: torch.Tensor  # float32; <= 0 -> greedy
    top_k: torch.Tensor  # int64; <= 0 -> off
    top_p: torch.Tensor  # float32; >= 1 -> off
    repetition_penalty: torch.Tensor  # float32; 1 -> off

    def index(self, rows: torch.Tensor) -> SamplingTensors:
        return SamplingTensors(
            self.temperature[rows], self.top_k[rows], self.top_p[rows], self.repetition_penalty[rows]
        )

    def head(self, b: int) -> SamplingTensors:
        """Rows ``[0, b)`` as views (no gather: engines keep their slots packed)."""
        t = self
        return SamplingTensors(t.temperature[:b], t.top_k[:b], t.top_p[:b], t.repetition_penalty[:b])


@dataclass(frozen=True)
class SamplingParams:
    """Host-side parameters of one request's sampler (validated; written into a ``SamplingTable`` row)."""

    do_sample: bool = True
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    repetition_penalty: float = 1.0

    def __post_init__(self) -> None:
        if not self.temperature >= 0.0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 = off), got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if not self.repetition_penalty > 0.0:
            raise ValueError(f"repetition_penalty must be > 0, got {self.repetition_penalty}")

    @property
    def effective_temperature(self) -> float:
        return self.temperature if self.do_sample else 0.0


# The widest top-k the sort-free path serves: ``torch.topk`` of this many columns is a selection, not a
# sort of the vocabulary; a request asking for more takes the full path.
TOP_K_CAP = 64


class Sampler(enum.IntEnum):
    """Which sampling code a batch can take, chosen on the host from its requests' parameters (a static
    property of a step, e.g. one CUDA-graph variant). Every variant draws exactly the tokens ``FULL`` would
    for the batches it is chosen for."""

    FULL = 0  # sorted top-k and top-p
    TOP_K = 1  # no row uses top-p; top-k of at most TOP_K_CAP (or off) by selection
    GREEDY = 2  # every row greedy: arg-max, no noise

    @classmethod
    def for_params(cls, params: Iterable[SamplingParams]) -> Sampler:
        """The most specialised variant valid for every one of ``params``."""
        return min((cls._one(p) for p in params), default=cls.GREEDY)

    @classmethod
    def _one(cls, p: SamplingParams) -> Sampler:
        if p.effective_temperature <= 0:
            return cls.GREEDY
        if p.top_p >= 1.0 and p.top_k <= TOP_K_CAP:
            return cls.TOP_K
        return cls.FULL


class SamplingTable:
    """Per-slot sampling parameters ``[S]`` on device; rows are written at admission, read every step."""

    def __init__(self, num_slots: int, device: torch.device | str = "cpu") -> None:
        self.tensors = SamplingTensors(
            temperature=torch.zeros(num_slots, dtype=torch.float32, device=device),
            top_k=torch.zeros(num_slots, dtype=torch.int64, device=device),
            top_p=torch.ones(num_slots, dtype=torch.float32, device=device),
            repetition_penalty=torch.ones(num_slots, dtype=torch.float32, device=device),
        )

    def set_row(self, slot: int, params: SamplingParams, writes: ImmediateWrites = IMMEDIATE) -> None:
        t = self.tensors
        writes.put(t.temperature, slot, params.effective_temperature)
        writes.put(t.top_k, slot, params.top_k)
        writes.put(t.top_p, slot, params.top_p)
        writes.put(t.repetition_penalty, slot, params.repetition_penalty)


def apply_repetition_penalty(logits: torch.Tensor, seen: torch.Tensor, penalty: torch.Tensor) -> torch.Tensor:
    """transformers' rule on the *set* of seen tokens: negative scores times p, positive ones divided by p."""
    p = penalty.to(logits.dtype).unsqueeze(-1)
    penalized = torch.where(logits < 0, logits * p, logits / p)
    return torch.where(seen, penalized, logits)


def filter_top_k_top_p(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Per-row top-k then top-p masks (``-inf``), with transformers' tie and keep-at-least-one rules."""
    vocab = logits.shape[-1]
    sorted_logits, order = torch.sort(logits, dim=-1, descending=False, stable=True)
    k = torch.where(top_k <= 0, vocab, top_k.clamp(max=vocab))
    kth = sorted_logits.gather(-1, (vocab - k).unsqueeze(-1))
    # Threshold on the k-th largest value: ties with it survive, as with torch.topk(...)[..., -1].
    remove_sorted = sorted_logits < kth
    sorted_logits = sorted_logits.masked_fill(remove_sorted, float("-inf"))
    cum = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
    nucleus_cut = cum <= (1.0 - top_p.to(cum.dtype)).unsqueeze(-1)
    nucleus_cut[..., -1] = False  # the most likely token always stays
    remove_sorted = remove_sorted | (nucleus_cut & (top_p < 1.0).unsqueeze(-1))
    remove = torch.zeros_like(remove_sorted).scatter(-1, order, remove_sorted)
    return logits.masked_fill(remove, float("-inf"))


def filter_top_k(logits: torch.Tensor, top_k: torch.Tensor) -> torch.Tensor:
    """``filter_top_k_top_p`` for rows without top-p whose ``top_k`` is off or at most ``TOP_K_CAP``: the
    same threshold (the k-th largest value, ties kept) from a selection instead of a full sort."""
    col, off = _top_k_columns(top_k, logits.shape[-1])
    return _mask_top_k(logits, col, off)


def _top_k_columns(top_k: torch.Tensor, vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's k-th largest column in a top-``TOP_K_CAP`` selection, and whether its top-k is off
    (``[B, 1]`` each)."""
    width = min(TOP_K_CAP, vocab_size)
    return (top_k.clamp(1, width) - 1).unsqueeze(-1), (top_k <= 0).unsqueeze(-1)


def _mask_top_k(logits: torch.Tensor, col: torch.Tensor, off: torch.Tensor) -> torch.Tensor:
    largest = torch.topk(logits, min(TOP_K_CAP, logits.shape[-1]), dim=-1).values
    kth = largest.gather(-1, col).masked_fill(off, float("-inf"))
    return logits.masked_fill(logits < kth, float("-inf"))


@dataclass(frozen=True)
class DrawRows:
    """What ``sample`` derives from its rows' ``SamplingTensors`` before it draws: computed once for the
    draws of one step that share rows and parameters (a frame's code-predictor groups), not once per draw.
    The same expressions, so the same values."""

    greedy: torch.Tensor  # [B] bool
    temperature: torch.Tensor  # [B, 1] float32, 1 on greedy rows
    top_k: tuple[torch.Tensor, torch.Tensor] | None  # ``_top_k_columns`` (for ``Sampler.TOP_K`` only)

    @classmethod
    def of(cls, params: SamplingTensors, vocab_size: int, sampler: Sampler) -> DrawRows:
        greedy = params.temperature <= 0
        temp = torch.where(greedy, torch.ones_like(params.temperature), params.temperature)
        top_k = _top_k_columns(params.top_k, vocab_size) if sampler is Sampler.TOP_K else None
        return cls(greedy, temp.to(torch.float32).unsqueeze(-1), top_k)


def sample(
    logits: torch.Tensor,
    params: SamplingTensors,
    seed: torch.Tensor,
    step: torch.Tensor,
    stream: int | torch.Tensor = 0,
    seen: torch.Tensor | None = None,
    banned: torch.Tensor | None = None,
    all_greedy: bool = False,
    noise: torch.Tensor | None = None,
    sampler: Sampler = Sampler.FULL,
    rows: DrawRows | None = None,
) -> torch.Tensor:
    """Draw one token per row of ``logits [B, V]``; returns int64 ``[B]``.

    ``seed``/``step`` are ``[B]`` int64 (the request's seed and, e.g., its frame index); ``stream``
    separates independent draws at the same step (e.g. the codebook group). ``seen [B, V]`` (bool) drives
    the repetition penalty; ``banned`` (``[V]`` or ``[B, V]`` bool) tokens are never drawn.
    ``all_greedy`` is a host-side promise that every row is greedy (known from the requests, not from
    device data); it skips the sort and the noise and gives the same tokens. ``noise [B, V]``, when given,
    is ``gumbel_noise(seed, step, stream, V)`` computed by the caller (a frame's groups draw theirs in one
    batched call instead of one hash chain each). ``sampler`` is the batch's ``Sampler`` variant (a host-side
    promise like ``all_greedy``, which is ``Sampler.GREEDY``). ``rows``, when given, is
    ``DrawRows.of(params, V, sampler)`` computed by the caller once for several draws.
    """
    scores = logits.float()
    if seen is not None:
        scores = apply_repetition_penalty(scores, seen, params.repetition_penalty)
    if banned is not None:
        scores = scores.masked_fill(banned, float("-inf"))
    greedy_tok = scores.argmax(dim=-1)
    if all_greedy or sampler is Sampler.GREEDY:
        return greedy_tok
    if rows is None:
        rows = DrawRows.of(params, scores.shape[-1], sampler)
    greedy = rows.greedy
    scaled = scores / rows.temperature
    if sampler is Sampler.TOP_K:
        assert rows.top_k is not None, "DrawRows made for another sampler"
        scaled = _mask_top_k(scaled, *rows.top_k)
    else:
        scaled = filter_top_k_top_p(scaled, params.top_k, params.top_p)
    if noise is None:
        noise = gumbel_noise(seed, step, stream, scores.shape[-1])
    drawn = (scaled + noise).argmax(dim=-1)
    return torch.where(greedy, greedy_tok, drawn)
