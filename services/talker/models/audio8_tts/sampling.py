"""The released Audio8 TTS sampler, per slot, on device (models.md §2.4 steps 2-4 and 6).

Order, as the reference's ``_processed_scores`` runs it:

1. top-k and top-p on the **raw** logits, in one pass: sort descending, ``cum = cumsum(softmax)``, drop a
   candidate whose rank is ``>= k`` or whose inclusive cumulative mass is ``> top_p``; the best candidate
   always stays. (Not transformers' rule, which keeps the candidate that crosses ``top_p``.)
2. *then* temperature (divide the surviving logits, clamped at 1e-5);
3. then the exponential race ``argmax(p / E)``, ``E ~ Exp(1)``. Since ``argmax(p / E) =
   argmax(log p - log E)`` and ``-log E`` is a standard Gumbel, the draw is Gumbel-max with the shared
   counter-based noise of ``services.talker.sampling`` (hashed per seed, step, stream and column), so a
   request draws the same numbers alone or batched, at any slot, inside a CUDA graph, with no host sync.

Greedy rows (``temperature <= 0``) take the argmax and skip RAS, as the reference's ``do_sample=False``.

**Logits layout.** The slow AR's logits are computed only for the allowed rows of the LM head (the 4096
semantic tokens, then ``<|im_end|>``): the sampler takes compact ``[B, 4097]`` logits whose column ``c <
4096`` is ``<|semantic:c|>`` (token ``semantic_begin_id + c``) and column 4096 is ``<|im_end|>``
(``compact_vocab_ids`` gives the head rows in that order). The fast AR's heads are ``[B, 4096]``.

**RAS** (repetition-aware sampling). Each semantic step also draws a second sample with the same top-k and
the slot's ``ras_top_p`` (0.9) / ``ras_temperature`` (1.0) from an independent noise stream; when the
first sample is a semantic token found among the slot's last ``ras_window`` (10) recorded tokens, the
second one is used. Reading of the reference's bookkeeping, reproduced exactly: the window holds the
*chosen* tokens; the token of a slot's very first sampled frame is never recorded (the reference creates
its window after that frame), so RAS can first trigger at frame 2. The window is a per-slot ring
``history [S, W + 1]`` (-1 = empty; column ``W`` is a scratch column that inactive rows write to, so a
padding row that repeats an active row's slot cannot clobber it) updated in place, for active rows only.

Noise streams per (seed, step): 0 = the semantic draw, 1 = the RAS draw, ``FAST_STREAM_BASE + k`` = the
fast AR's codebook ``k`` (1..9).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from services.talker.sampling import SamplingParams, seed_key, slot_noise

NUM_SEMANTIC = 4096
EOS_INDEX = NUM_SEMANTIC  # compact column of <|im_end|>
COMPACT_VOCAB = NUM_SEMANTIC + 1
FAST_VOCAB = 4096

SEMANTIC_STREAM = 0
RAS_STREAM = 1
FAST_STREAM_BASE = 16  # codebook k (1..9) draws from stream 16 + k

MIN_TEMPERATURE = 1e-5  # the reference clamps the divisor here


@dataclass(frozen=True)
class RasParams:
    """Repetition-aware sampling of one slot (config.json's ``ras_*``); ``window = 0`` turns it off."""

    window: int = 10
    temperature: float = 1.0
    top_p: float = 0.9

    def __post_init__(self) -> None:
        if self.window < 0:
            raise ValueError(f"ras_window_size must be >= 0, got {self.window}")
        if not self.temperature >= 0.0:
            raise ValueError(f"ras_temperature must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"ras_top_p must be in (0, 1], got {self.top_p}")


def check_sampling_params(params: SamplingParams, field: str = "sampling") -> None:
    """The released sampler has no repetition penalty (RAS replaces it): refuse one, naming the field."""
    if params.repetition_penalty != 1.0:
        raise ValueError(
            f"{field}.repetition_penalty: Audio8 TTS samples with repetition-aware sampling and takes no "
            f"repetition penalty (got {params.repetition_penalty})"
        )


def compact_vocab_ids(
    semantic_begin_id: int,
    eos_token_id: int,
    num_semantic: int = NUM_SEMANTIC,
    device: torch.device | str = "cpu",
) -> torch.Tensor:
    """Vocabulary ids of the compact columns ``[num_semantic + 1]``: the semantic tokens, then eos."""
    ids = torch.arange(semantic_begin_id, semantic_begin_id + num_semantic + 1, device=device)
    ids[num_semantic] = eos_token_id
    return ids


def filter_top_k_top_p(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """The released candidate filter on raw logits ``[B, V]`` (per-row ``top_k [B]``, ``top_p [B]``).

    ``top_k <= 0`` and ``top_p >= 1`` turn a filter off. Masked entries become ``-inf``.
    """
    order, cum = _sort_stats(logits)
    return logits.masked_fill(_removed(order, cum, top_k, top_p), float("-inf"))


def _sort_stats(scores: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Descending order (stable: ties keep column order) and inclusive cumulative softmax mass."""
    sorted_scores, order = torch.sort(scores, dim=-1, descending=True, stable=True)
    return order, sorted_scores.softmax(dim=-1).cumsum(dim=-1)


def _removed(
    order: torch.Tensor, cum: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor
) -> torch.Tensor:
    vocab = cum.shape[-1]
    rank = torch.arange(vocab, device=cum.device)
    k = torch.where(top_k <= 0, torch.full_like(top_k, vocab), top_k)
    p = top_p.to(cum.dtype).unsqueeze(-1)
    # top_p == 1 is "off" explicitly: a float cumsum may end a hair above 1.0 and would cut the tail.
    remove = (rank.unsqueeze(0) >= k.unsqueeze(-1)) | ((cum > p) & (p < 1.0))
    remove[..., 0] = False  # the best candidate always stays
    return torch.zeros_like(remove).scatter(-1, order, remove)


def _tempered_draw(
    scores: torch.Tensor, removed: torch.Tensor, temperature: torch.Tensor, noise: torch.Tensor
) -> torch.Tensor:
    temp = temperature.to(scores.dtype).clamp_min(MIN_TEMPERATURE).unsqueeze(-1)
    return (scores.masked_fill(removed, float("-inf")) / temp + noise).argmax(dim=-1)


def draw(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    noise: torch.Tensor,
) -> torch.Tensor:
    """One released-order draw per row of ``logits [B, V]`` with Gumbel ``noise [B, V]``; int64 ``[B]``.

    Rows with ``temperature <= 0`` take the argmax.
    """
    scores = logits.float()
    order, cum = _sort_stats(scores)
    drawn = _tempered_draw(scores, _removed(order, cum, top_k, top_p), temperature, noise)
    return torch.where(temperature <= 0, scores.argmax(dim=-1), drawn)


@dataclass
class SemanticDraw:
    index: torch.Tensor  # [B] int64 compact column: 0..4095 semantic code, 4096 <|im_end|>
    token: torch.Tensor  # [B] int64 vocabulary id (row 0 of the next input)
    code: torch.Tensor  # [B] int64 semantic code for the fast AR (0 on eos rows, as the reference clamps)
    eos: torch.Tensor  # [B] bool


@dataclass
class Audio8SamplingState:
    """Per-slot sampling state ``[S, ...]`` on device, owned by the engine/adapter.

    Written at admission (``reset_slot``, host-side, outside captured graphs); read, and for the RAS
    ring updated, by ``sample_semantic`` / ``sample_fast`` inside the frame step.
    """

    seed: torch.Tensor  # [S] int64
    seed_key: torch.Tensor  # [S] int64: ``sampling.seed_key`` of the seed (the draws' keys mix in the step)
    temperature: torch.Tensor  # [S] float32; <= 0 greedy
    top_k: torch.Tensor  # [S] int64; <= 0 off
    top_p: torch.Tensor  # [S] float32; 1 off
    fast_temperature: torch.Tensor  # [S] the fast AR's (the released model uses the same as above)
    fast_top_k: torch.Tensor
    fast_top_p: torch.Tensor
    ras_window: torch.Tensor  # [S] int64; 0 = RAS off
    ras_temperature: torch.Tensor  # [S] float32
    ras_top_p: torch.Tensor  # [S] float32
    history: torch.Tensor  # [S, W + 1] int64 compact indices, -1 empty; column W is scratch
    draws: torch.Tensor  # [S] int64 semantic draws made for the slot's current request
    min_frames: torch.Tensor  # [S] int64: <|im_end|> is banned while step < min_frames
    semantic_begin_id: int = 151678
    eos_token_id: int = 151645

    @classmethod
    def allocate(
        cls,
        num_slots: int,
        device: torch.device | str = "cpu",
        *,
        max_window: int = 10,
        semantic_begin_id: int = 151678,
        eos_token_id: int = 151645,
    ) -> Audio8SamplingState:
        if max_window < 1:
            raise ValueError(f"max_window must be >= 1, got {max_window}")

        def full(value: float, dtype: torch.dtype) -> torch.Tensor:
            return torch.full((num_slots,), value, dtype=dtype, device=device)

        return cls(
            seed=full(0, torch.int64),
            seed_key=full(0, torch.int64),
            temperature=full(0.0, torch.float32),
            top_k=full(0, torch.int64),
            top_p=full(1.0, torch.float32),
            fast_temperature=full(0.0, torch.float32),
            fast_top_k=full(0, torch.int64),
            fast_top_p=full(1.0, torch.float32),
            ras_window=full(0, torch.int64),
            ras_temperature=full(1.0, torch.float32),
            ras_top_p=full(1.0, torch.float32),
            history=torch.full((num_slots, max_window + 1), -1, dtype=torch.int64, device=device),
            draws=full(0, torch.int64),
            min_frames=full(0, torch.int64),
            semantic_begin_id=semantic_begin_id,
            eos_token_id=eos_token_id,
        )

    @property
    def max_window(self) -> int:
        return self.history.shape[1] - 1

    def reset_slot(
        self,
        slot: int,
        *,
        seed: int,
        params: SamplingParams,
        ras: RasParams | None = None,
        fast_params: SamplingParams | None = None,
        min_frames: int = 0,
    ) -> None:
        """Prepare ``slot`` for a new request. ``ras`` defaults to the released ``RasParams()``;
        ``fast_params`` defaults to ``params`` (the released model samples both stages alike)."""
        if not -(2**63) <= seed < 2**63:
            raise ValueError(f"seed must fit in int64, got {seed}")
        ras = RasParams() if ras is None else ras
        if ras.window > self.max_window:
            raise ValueError(f"ras_window_size {ras.window} exceeds the allocated window {self.max_window}")
        if min_frames < 0:
            raise ValueError(f"min_frames must be >= 0, got {min_frames}")
        fast = params if fast_params is None else fast_params
        check_sampling_params(params)
        check_sampling_params(fast, "subtalker_sampling")
        self.seed[slot].fill_(seed)
        self.seed_key[slot].fill_(seed_key(seed))
        self.temperature[slot].fill_(params.effective_temperature)
        self.top_k[slot].fill_(params.top_k)
        self.top_p[slot].fill_(params.top_p)
        self.fast_temperature[slot].fill_(fast.effective_temperature)
        self.fast_top_k[slot].fill_(fast.top_k)
        self.fast_top_p[slot].fill_(fast.top_p)
        self.ras_window[slot].fill_(ras.window)
        self.ras_temperature[slot].fill_(ras.temperature)
        self.ras_top_p[slot].fill_(ras.top_p)
        self.history[slot].fill_(-1)
        self.draws[slot].fill_(0)
        self.min_frames[slot].fill_(min_frames)


def _as_rows(step: torch.Tensor | int, like: torch.Tensor) -> torch.Tensor:
    if isinstance(step, int):
        return torch.full_like(like, step)
    return step.to(device=like.device, dtype=torch.int64).expand_as(like)


def sample_semantic(
    logits: torch.Tensor,
    rows: torch.Tensor,
    state: Audio8SamplingState,
    step: torch.Tensor | int,
    *,
    active: torch.Tensor | None = None,
    all_greedy: bool = False,
) -> SemanticDraw:
    """The semantic token of each row from compact ``logits [B, 4097]``.

    ``rows [B]`` are the rows' slot indices into ``state``; ``step [B]`` (or one int) is each row's frame
    index (frames already produced), which keys the noise and drives the ``min_frames`` ban. ``active
    [B]`` (bool, default all) marks the rows whose RAS history advances (padding rows of a static batch
    pass False). ``all_greedy`` is a host-side promise that every row is greedy (skips sort and noise).
    Updates ``state.history`` / ``state.draws`` in place.
    """
    b, vocab = logits.shape
    if vocab != COMPACT_VOCAB:
        raise ValueError(
            f"sample_semantic expects compact logits [B, {COMPACT_VOCAB}], got {list(logits.shape)}"
        )
    t = _as_rows(step, rows)
    act = torch.ones_like(rows, dtype=torch.bool) if active is None else active
    scores = logits.float()
    ban = (t < state.min_frames[rows]).unsqueeze(-1) & (
        torch.arange(vocab, device=logits.device) == EOS_INDEX
    ).unsqueeze(0)
    scores = scores.masked_fill(ban, float("-inf"))
    greedy_idx = scores.argmax(dim=-1)
    draws = state.draws[rows]
    if all_greedy:
        index = greedy_idx
    else:
        temperature = state.temperature[rows]
        top_k = state.top_k[rows]
        # Streams 0 (SEMANTIC_STREAM) and 1 (RAS_STREAM) in one call; arange, not a host list, so the
        # step stays capturable.
        noise = slot_noise(state.seed_key[rows], t, torch.arange(2, device=logits.device), vocab)  # [B, 2, V]
        order, cum = _sort_stats(scores)
        normal = _tempered_draw(
            scores, _removed(order, cum, top_k, state.top_p[rows]), temperature, noise[:, 0]
        )
        high = _tempered_draw(
            scores,
            _removed(order, cum, top_k, state.ras_top_p[rows]),
            state.ras_temperature[rows],
            noise[:, 1],
        )
        # Recorded entries of the ring: n = draws - 1 tokens (the first draw is never recorded); column c
        # holds the entry of age (n - 1 - c) mod W. Only the last ras_window entries count.
        w = state.max_window
        hist = state.history[rows, :w]
        n = (draws - 1).clamp_min(0)
        age = torch.remainder(n.unsqueeze(-1) - 1 - torch.arange(w, device=logits.device), w)
        in_window = (age < state.ras_window[rows].unsqueeze(-1)) & (hist == normal.unsqueeze(-1))
        repeat = in_window.any(dim=-1) & (normal < NUM_SEMANTIC)
        index = torch.where(temperature <= 0, greedy_idx, torch.where(repeat, high, normal))
    _record(state, rows, draws, index, act)
    eos = index == EOS_INDEX
    token = torch.where(eos, torch.full_like(index, state.eos_token_id), index + state.semantic_begin_id)
    return SemanticDraw(
        index=index, token=token, code=torch.where(eos, torch.zeros_like(index), index), eos=eos
    )


def _record(
    state: Audio8SamplingState,
    rows: torch.Tensor,
    draws: torch.Tensor,
    index: torch.Tensor,
    active: torch.Tensor,
) -> None:
    w = state.max_window
    keep = active & (draws >= 1)
    col = torch.where(keep, torch.remainder(draws - 1, w), torch.full_like(draws, w))
    state.history.index_put_((rows, col), index)
    state.draws.index_add_(0, rows, active.to(torch.int64))


def fast_noise(
    rows: torch.Tensor, state: Audio8SamplingState, step: torch.Tensor | int, num_codebooks: int = 10
):
    """Gumbel noise ``[B, num_codebooks - 1, 4096]`` for codebooks 1..num_codebooks-1 in one call (the
    same numbers ``sample_fast`` would draw one codebook at a time)."""
    t = _as_rows(step, rows)
    streams = FAST_STREAM_BASE + torch.arange(1, num_codebooks, device=rows.device)
    return slot_noise(state.seed_key[rows], t, streams, FAST_VOCAB)


def sample_fast(
    logits: torch.Tensor,
    rows: torch.Tensor,
    state: Audio8SamplingState,
    step: torch.Tensor | int,
    codebook_index: int,
    *,
    all_greedy: bool = False,
    noise: torch.Tensor | None = None,
) -> torch.Tensor:
    """Code ``codebook_index`` (1..9) of each row from the fast AR's ``logits [B, 4096]``; int64 ``[B]``.

    Same filter order and the slot's fast top-k/top-p/temperature, no RAS, noise stream
    ``FAST_STREAM_BASE + codebook_index``. ``noise [B, 4096]`` may be passed in (``fast_noise(...)[:, k-1]``).
    """
    if codebook_index < 1:
        raise ValueError(
            f"codebook_index must be >= 1 (codebook 0 is the semantic token), got {codebook_index}"
        )
    if all_greedy:
        return logits.float().argmax(dim=-1)
    if noise is None:
        t = _as_rows(step, rows)
        noise = slot_noise(state.seed_key[rows], t, FAST_STREAM_BASE + codebook_index, logits.shape[-1])
    return draw(logits, state.fast_temperature[rows], state.fast_top_k[rows], state.fast_top_p[rows], noise)
