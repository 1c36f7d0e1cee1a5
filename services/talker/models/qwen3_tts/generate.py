"""A plain generation loop for one request or a batch, built only from the model's pieces (prefill over the
static KV cache, then ``frame_step`` + one-token talker decode per frame).

This is the reference "alone" run for parity tests and for checking the engine against; it is not the
serving loop (it reads EOS flags back to the host every frame and builds batches per tick).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from ...sampling import Sampler, SamplingParams
from .backbone import KVCache
from .frame import FrameState, frame_step
from .model import Qwen3TTSTalker
from .prompt import TalkerPrompt

# (request index, frames produced so far) -> (new text ids, text complete) or None when nothing new.
TextSource = Callable[[int, int], tuple[list[int], bool] | None]


@dataclass(frozen=True)
class TalkerRequest:
    prompt: TalkerPrompt
    seed: int = 0
    talker: SamplingParams = field(default_factory=lambda: SamplingParams(do_sample=False))
    subtalker: SamplingParams = field(default_factory=lambda: SamplingParams(do_sample=False))
    max_new_frames: int = 2048
    min_new_frames: int = 2  # EOS is banned before this many frames (the reference's min_new_tokens)

    def __post_init__(self) -> None:
        if self.max_new_frames <= 0:
            raise ValueError(f"max_new_frames must be > 0, got {self.max_new_frames}")
        if self.min_new_frames < 0:
            raise ValueError(f"min_new_frames must be >= 0, got {self.min_new_frames}")


@dataclass
class TalkerResult:
    codes: torch.Tensor  # [T, G] int64, the frames before EOS
    c0: list[int]  # every group-0 code sampled, EOS included
    hidden: torch.Tensor  # [T, H] talker hidden state each frame was sampled from
    stopped_on_eos: bool
    starved_frames: int = 0  # ticks this request sat out waiting for text


def prefill(
    model: Qwen3TTSTalker,
    embeds: torch.Tensor,
    cache: KVCache,
    slot: int,
    start: int = 0,
    chunk: int | None = None,
) -> torch.Tensor:
    """Run ``embeds [T, H]`` into ``slot`` from position ``start``, ``chunk`` tokens per call; returns the
    last post-norm hidden state ``[H]``."""
    total = embeds.shape[0]
    step = total if chunk is None else chunk
    if step <= 0:
        raise ValueError(f"prefill chunk must be > 0, got {chunk}")
    slot_ids = torch.tensor([slot], device=embeds.device)
    h = embeds.new_empty(0)
    for lo in range(0, total, step):
        x = embeds[lo : lo + step].unsqueeze(0)
        positions = torch.arange(start + lo, start + lo + x.shape[1], device=embeds.device).unsqueeze(0)
        h = model(x, positions, cache, slot_ids)
    return h[0, -1]


@torch.no_grad()
def generate(
    model: Qwen3TTSTalker,
    requests: list[TalkerRequest],
    *,
    prefill_chunk: int | None = None,
    text_source: TextSource | None = None,
    max_len: int | None = None,
    max_idle_ticks: int = 100,
) -> list[TalkerResult]:
    """Generate every request to EOS or its frame limit, batching all runnable requests per frame.

    ``text_source`` is polled once per tick for each request whose text is still open; a request without
    text for its next frame sits the tick out (input-starved). If no request can run for
    ``max_idle_ticks`` consecutive ticks, the loop gives up with ``RuntimeError``.
    """
    if not requests:
        return []
    device = model.codec_head.weight.device
    n = len(requests)
    lengths = [r.prompt.prefill_embeds.shape[0] for r in requests]
    need = max(ln + r.max_new_frames for ln, r in zip(lengths, requests, strict=True))
    max_len = need if max_len is None else max_len
    if max_len < need:
        raise ValueError(f"max_len {max_len} is shorter than prompt + max_new_frames ({need})")
    cache = model.allocate_kv_cache(n, max_len)
    predictor_cache = model.allocate_predictor_cache(n)
    max_text = max(len(r.prompt.trailing_ids) for r in requests) + (max_len if text_source else 0) + 1
    state = FrameState.allocate(model, n, max_text)
    feeds = [r.prompt.text_feed() for r in requests]
    # Per batch, not per tick: every variant draws what FULL would, so this choice cannot change a token.
    samplers = (
        Sampler.for_params(r.talker for r in requests),
        Sampler.for_params(r.subtalker for r in requests),
    )
    hidden = torch.zeros(n, model.hidden_size, device=device, dtype=model.codec_head.weight.dtype)
    for i, r in enumerate(requests):
        state.reset_slot(
            i,
            seed=r.seed,
            talker=r.talker,
            subtalker=r.subtalker,
            trailing_ids=r.prompt.trailing_ids,
            text_complete=r.prompt.text_complete,
            min_new_tokens=r.min_new_frames,
        )
        hidden[i] = prefill(model, r.prompt.prefill_embeds.to(hidden.dtype), cache, i, chunk=prefill_chunk)

    codes: list[list[torch.Tensor]] = [[] for _ in requests]
    hiddens: list[list[torch.Tensor]] = [[] for _ in requests]
    c0s: list[list[int]] = [[] for _ in requests]
    eos_hit = [False] * n
    starved = [0] * n
    idle = 0
    active = list(range(n))
    while active:
        runnable = []
        for i in active:
            frames = len(codes[i])
            if text_source is not None and not feeds[i].complete:
                new = text_source(i, frames)
                if new is not None:
                    queued = feeds[i].queued
                    state.append_text(i, queued, feeds[i].push(*new), feeds[i].complete)
            if feeds[i].starved(frames):
                starved[i] += 1
            else:
                runnable.append(i)
        if not runnable:
            idle += 1
            if idle > max_idle_ticks:
                raise RuntimeError(f"requests {active} stayed input-starved for {max_idle_ticks} ticks")
            continue
        idle = 0
        rows = torch.tensor(runnable, device=device)
        out = frame_step(model, hidden[rows], rows, state, predictor_cache, samplers=samplers)
        eos_flags = out.eos.tolist()
        c0_list = out.codes[:, 0].tolist()
        cont_rows: list[int] = []
        cont_idx: list[int] = []
        for j, i in enumerate(runnable):
            c0s[i].append(c0_list[j])
            if eos_flags[j]:
                eos_hit[i] = True
                continue
            codes[i].append(out.codes[j])
            hiddens[i].append(hidden[i].clone())
            if len(codes[i]) < requests[i].max_new_frames:
                cont_rows.append(i)
                cont_idx.append(j)
        if cont_rows:
            x = out.next_embed[cont_idx].unsqueeze(1)
            positions = torch.tensor([[lengths[i] + len(codes[i]) - 1] for i in cont_rows], device=device)
            slot_ids = torch.tensor(cont_rows, device=device)
            hidden[slot_ids] = model(x, positions, cache, slot_ids)[:, 0]
        finished = set(runnable) - set(cont_rows)
        active = [i for i in active if i not in finished]

    results = []
    empty_codes = torch.zeros(0, model.num_code_groups, dtype=torch.int64, device=device)
    for i in range(n):
        frame_codes = torch.stack(codes[i]) if codes[i] else empty_codes
        frame_hidden = torch.stack(hiddens[i]) if hiddens[i] else hidden.new_zeros(0, model.hidden_size)
        results.append(TalkerResult(frame_codes, c0s[i], frame_hidden, eos_hit[i], starved[i]))
    return results
