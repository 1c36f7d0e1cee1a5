"""The per-frame step of Qwen3-TTS for a batch of slots (models.md §1.5), entirely on device.

Given the talker's post-norm hidden state ``h [B, H]`` for each row's current frame ``t``:

1. c0 from ``codec_head(h)``: repetition penalty over the slot's past c0 (a ``[S, V]`` presence table),
   EOS banned while ``t < min_new_tokens``, ids ``[V-1024, V)`` except EOS banned, then the row's sampler;
2. the code predictor on a fresh frame-local cache: a 2-token prefill ``proj([h, E_c(c0)])`` gives c1,
   then G-2 one-token steps ``proj(emb[g-2](c_{g-1}))`` give c2..c_{G-1};
3. the next talker input ``E_c(c0) + sum_g emb[g-1](c_g) + text_t``, where ``text_t`` is the slot's trailing
   text token ``t`` projected by ``text_projection`` (or ``tts_pad`` once the queue is exhausted and
   complete).

No ``.item()``, no data-dependent Python branches: batch shape and the group loop are static, so one tick
(talker decode + this step) can be captured as a CUDA graph per batch bucket. Random draws are keyed by
(seed, frame index ``t``, group) so a seeded request draws the same numbers alone or batched.

Input starvation (streamed text): the text for frame ``t`` must be queued (or the text complete) before
the slot runs frame ``t``; a slot without it is *input-starved* and the engine must leave it out of the
tick (it waits, it never consumes ``pad`` early). See ``prompt.TextFeed`` for the host-side rule;
``FrameOutput.starved`` reports any row that was stepped anyway.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ...sampling import (
    DrawRows,
    Sampler,
    SamplingParams,
    SamplingTable,
    gumbel_from_keys,
    sample,
    seed_key,
    step_keys_from,
    stream_keys,
)
from ...slot_writes import IMMEDIATE, ImmediateWrites
from .backbone import KVCache
from .model import Qwen3TTSTalker


@dataclass
class FrameState:
    """Per-slot decode state ``[S, ...]`` on the model's device, owned by the engine.

    ``frames`` counts frames already produced (= index ``t`` of the next frame); ``text_ids[:, :text_len]``
    is each slot's trailing text queue (ending with ``tts_eos`` once ``text_done``).
    """

    seen_c0: torch.Tensor  # [S, V] bool
    frames: torch.Tensor  # [S] int64
    seed: torch.Tensor  # [S] int64
    seed_key: torch.Tensor  # [S] int64: ``sampling.seed_key`` of the slot's seed (its draws' keys)
    min_new_tokens: torch.Tensor  # [S] int64
    text_ids: torch.Tensor  # [S, max_text] int64
    text_len: torch.Tensor  # [S] int64
    text_done: torch.Tensor  # [S] bool
    talker: SamplingTable
    subtalker: SamplingTable

    @classmethod
    def allocate(
        cls, model: Qwen3TTSTalker, num_slots: int, max_text: int, device: torch.device | str | None = None
    ) -> FrameState:
        device = device or model.codec_head.weight.device
        vocab = model.config.talker.vocab_size

        def zeros(*shape: int, dtype: torch.dtype = torch.int64) -> torch.Tensor:
            return torch.zeros(shape, dtype=dtype, device=device)

        return cls(
            seen_c0=zeros(num_slots, vocab, dtype=torch.bool),
            frames=zeros(num_slots),
            seed=zeros(num_slots),
            seed_key=zeros(num_slots),
            min_new_tokens=zeros(num_slots),
            text_ids=zeros(num_slots, max_text),
            text_len=zeros(num_slots),
            text_done=zeros(num_slots, dtype=torch.bool),
            talker=SamplingTable(num_slots, device),
            subtalker=SamplingTable(num_slots, device),
        )

    @property
    def max_text(self) -> int:
        return self.text_ids.shape[1]

    def reset_slot(
        self,
        slot: int,
        *,
        seed: int,
        talker: SamplingParams,
        subtalker: SamplingParams,
        trailing_ids: Sequence[int],
        text_complete: bool,
        min_new_tokens: int = 2,
        writes: ImmediateWrites = IMMEDIATE,
    ) -> None:
        """Prepare ``slot`` for a new request (host-side writes at admission, outside captured graphs; with
        ``writes`` a ``SlotWrites``, made at its flush together with the tick's other admissions)."""
        if not -(2**63) <= seed < 2**63:
            raise ValueError(f"seed must fit in int64, got {seed}")
        writes.put(self.seen_c0, slot, False)
        writes.put(self.frames, slot, 0)
        writes.put(self.seed, slot, seed)
        writes.put(self.seed_key, slot, seed_key(seed))
        writes.put(self.min_new_tokens, slot, min_new_tokens)
        writes.put(self.text_len, slot, 0)
        writes.put(self.text_done, slot, False)
        self.talker.set_row(slot, talker, writes)
        self.subtalker.set_row(slot, subtalker, writes)
        self.append_text(slot, 0, trailing_ids, text_complete, writes)

    def append_text(
        self, slot: int, queued: int, ids: Sequence[int], complete: bool, writes: ImmediateWrites = IMMEDIATE
    ) -> None:
        """Append ``ids`` after the ``queued`` tokens the host knows are already in ``slot``'s queue.

        The host tracks ``queued`` itself (``prompt.TextFeed``) so no device read is needed. ``complete``
        marks the end of text; the caller appends ``tts_eos`` as the last id (``TextFeed`` does).
        """
        end = queued + len(ids)
        if end > self.max_text:
            raise ValueError(f"slot {slot}: text queue overflow ({end} > max_text {self.max_text})")
        writes.span(self.text_ids, slot, queued, ids)
        writes.put(self.text_len, slot, end)
        writes.put(self.text_done, slot, complete)


@dataclass
class FrameOutput:
    codes: torch.Tensor  # [B, G] int64; a row whose c0 is EOS carries no audio
    next_embed: torch.Tensor  # [B, H] talker input for the row's next frame
    eos: torch.Tensor  # [B] bool
    starved: torch.Tensor  # [B] bool: the row had no queued text for its next input (engine bug if set)


def frame_step(
    model: Qwen3TTSTalker,
    hidden: torch.Tensor,
    slot_ids: torch.Tensor,
    state: FrameState,
    predictor_cache: KVCache,
    tts_pad_id: int | None = None,
    samplers: tuple[Sampler, Sampler] = (Sampler.FULL, Sampler.FULL),
) -> FrameOutput:
    """One frame for rows ``slot_ids [B]`` from their talker hidden states ``hidden [B, H]``.

    Updates ``state`` in place for those slots (seen c0 codes, frame counters). ``predictor_cache`` needs
    at least B rows and G positions (``model.allocate_predictor_cache``); its contents are scratch.
    ``samplers = (talker, code predictor)``: the ``Sampler`` variant every row of the batch allows there
    (a host-side promise, e.g. one graph variant): greedy skips the sort and the noise, top-k the sort.
    """
    cfg = model.config.talker
    groups = cfg.num_code_groups
    b = hidden.shape[0]
    pad_id = model.config.tts_pad_token_id if tts_pad_id is None else tts_pad_id
    cp = model.code_predictor
    device = hidden.device

    t = state.frames[slot_ids]
    seed = state.seed[slot_ids]
    vocab_ids = torch.arange(cfg.vocab_size, device=device)
    eos_too_early = (vocab_ids == cfg.codec_eos_id).unsqueeze(0) & (
        t < state.min_new_tokens[slot_ids]
    ).unsqueeze(1)
    # The random draws of all G samples of this frame in two batched calls (c0's vocabulary, then the
    # code predictor's for groups 1..G-1) instead of one hash chain per group: the same numbers, ~1/8 of
    # the kernels.
    keys: list[torch.Tensor] = []  # the rows' step keys, made once, and only if a draw samples

    def noise_for(streams: int | torch.Tensor, vocab: int) -> torch.Tensor:
        if not keys:
            keys.append(step_keys_from(state.seed_key[slot_ids], t))
        return gumbel_from_keys(stream_keys(keys[0], streams), vocab)

    c0 = sample(
        model.logits(hidden),
        state.talker.tensors.index(slot_ids),
        seed,
        t,
        stream=0,
        seen=state.seen_c0[slot_ids],
        banned=model.c0_banned.unsqueeze(0) | eos_too_early,
        sampler=samplers[0],
        noise=None if samplers[0] is Sampler.GREEDY else noise_for(0, cfg.vocab_size),
    )
    state.seen_c0.index_put_((slot_ids, c0), torch.ones_like(c0, dtype=torch.bool))

    sub = state.subtalker.tensors.index(slot_ids)
    parts = [model.embed_codec(c0)]  # the group embeddings of this frame, [B, H] each
    x = cp.small_to_mtp_projection(torch.stack([hidden, parts[0]], dim=1))
    # The predictor's positions are the same every frame (0, 1, then 2..G-1): its calls' RoPE tables and
    # masks are built once per batch size, not rebuilt ~12 launches at a time on each of its G-1 calls.
    call = cp.model.fixed_call(b, 0, 2, groups, x.dtype)
    h = cp.model(x, call.positions, predictor_cache, None, groups, call)
    noise = None
    if samplers[1] is not Sampler.GREEDY:
        streams = torch.arange(1, groups, device=device)
        noise = noise_for(streams, cp.lm_head[0].out_features)  # [B, G-1, V]

    # The rows' temperature and top-k columns once for all G-1 draws (about 6 launches each otherwise).
    vocab = cp.lm_head[0].out_features
    rows = None if samplers[1] is Sampler.GREEDY else DrawRows.of(sub, vocab, samplers[1])

    def draw(logits: torch.Tensor, g: int) -> torch.Tensor:
        n = None if noise is None else noise[:, g - 1]
        return sample(logits, sub, seed, t, stream=g, noise=n, sampler=samplers[1], rows=rows)

    codes = [c0, draw(cp.lm_head[0](h[:, -1]), 1)]
    for g in range(2, groups):
        parts.append(cp.model.codec_embedding[g - 2](codes[g - 1]))
        x = cp.small_to_mtp_projection(parts[-1]).unsqueeze(1)
        call = cp.model.fixed_call(b, g, 1, groups, x.dtype)
        h = cp.model(x, call.positions, predictor_cache, None, groups, call)
        codes.append(draw(cp.lm_head[g - 1](h[:, 0]), g))
    parts.append(cp.model.codec_embedding[groups - 2](codes[groups - 1]))

    text_len = state.text_len[slot_ids]
    has_text = t < text_len
    queued = state.text_ids[slot_ids, t.clamp(max=state.max_text - 1)]
    text_id = torch.where(has_text, queued, torch.full_like(queued, pad_id))
    next_embed = torch.stack(parts, dim=1).sum(1) + model.embed_text(text_id)

    state.frames.index_put_((slot_ids,), t + 1)
    return FrameOutput(
        codes=torch.stack(codes, dim=1),
        next_embed=next_embed,
        eos=c0 == cfg.codec_eos_id,
        starved=~has_text & ~state.text_done[slot_ids],
    )
