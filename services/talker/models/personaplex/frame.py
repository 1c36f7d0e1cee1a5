"""One duplex frame for a batch of slots, entirely on device: moshi's ``LMGen.step`` (models.md §3.3).

A slot's state is the **token column** it feeds next (17 rows: text, 8 agent codebooks, 8 user codebooks).
Step t of a slot:

1. its input is that column with row 9 (user codebook 0) taken from the user frame of this step; user
   codebooks 1..7 have delay 1, so the column already holds the *previous* user frame's;
2. the sum of the 17 embeddings goes through one Helium step at position t (ring KV), ``out_norm``, and
   ``text_linear`` gives the text token;
3. the depformer makes agent codebooks 0..7, each conditioned on the token before it (text for 0);
4. forced tokens (prompt phases; the delayed codebooks of the last prompt frame) replace samples, also as
   the depformer's conditioning;
5. the next column is (text, agent codes, -, this user frame's codebooks 1..7).

The output of step t is agent frame t-1, as moshi returns it: text and codebook 0 from the input column,
codebooks 1..7 just made (they are delayed by one frame). Step 0 has no output. Nothing here stops: a
duplex session runs until it is closed.

Rows with ``active`` false keep all of their state; the K/V they write lands at their own next ring index,
which their next real step overwrites first. Randomness is keyed by (seed, step, stream) as in
``services.talker.sampling``, so a seeded session draws the same tokens alone or batched.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ...sampling import DrawRows, Sampler, SamplingParams, SamplingTable, sample, seed_key, slot_noise
from .config import AGENT_STREAMS
from .model import PersonaPlexLM, RingKV

USER_ROW = 1 + AGENT_STREAMS  # row of user codebook 0 in a column
OUT_ROWS = 1 + AGENT_STREAMS  # text + agent codebooks


@dataclass
class DuplexState:
    """Per-slot decode state ``[S, ...]`` on the model's device."""

    column: torch.Tensor  # [S, 17] int64: the next input column
    user: torch.Tensor  # [S, 8] int64: this step's user frame (written by the engine before the step)
    steps: torch.Tensor  # [S] int64: steps taken = the position of the next step
    forced: torch.Tensor  # [S, 9] int64: forced text/agent tokens of the next step
    force: torch.Tensor  # [S, 9] bool: which of them are forced (cleared once stepped)
    seed: torch.Tensor  # [S] int64
    seed_key: torch.Tensor  # [S] int64: ``sampling.seed_key`` of the seed (the draws' keys mix in the step)
    active: torch.Tensor  # [S] bool
    text: SamplingTable
    audio: SamplingTable
    out: torch.Tensor  # [S, 9] int64: the last step's output frame
    out_valid: torch.Tensor  # [S] bool

    @classmethod
    def allocate(cls, num_slots: int, num_rows: int, device: torch.device | str) -> DuplexState:
        def zeros(*shape: int, dtype: torch.dtype = torch.int64) -> torch.Tensor:
            return torch.zeros(shape, dtype=dtype, device=device)

        return cls(
            column=zeros(num_slots, num_rows),
            user=zeros(num_slots, num_rows - USER_ROW),
            steps=zeros(num_slots),
            forced=zeros(num_slots, OUT_ROWS),
            force=zeros(num_slots, OUT_ROWS, dtype=torch.bool),
            seed=zeros(num_slots),
            seed_key=zeros(num_slots),
            active=zeros(num_slots, dtype=torch.bool),
            text=SamplingTable(num_slots, device),
            audio=SamplingTable(num_slots, device),
            out=zeros(num_slots, OUT_ROWS),
            out_valid=zeros(num_slots, dtype=torch.bool),
        )

    def reset_slot(self, slot: int, *, seed: int, text: SamplingParams, audio: SamplingParams) -> None:
        """Host-side writes at admission (outside captured graphs)."""
        if not -(2**63) <= seed < 2**63:
            raise ValueError(f"seed must fit in int64, got {seed}")
        # fill_ passes the value as a kernel argument; ``t[slot] = value`` copies a host scalar and waits for
        # the device (a join burst paid it per session).
        self.seed[slot].fill_(seed)
        self.seed_key[slot].fill_(seed_key(seed))
        self.text.set_row(slot, text)
        self.audio.set_row(slot, audio)
        self.steps[slot].fill_(0)
        self.force[slot].fill_(False)
        self.out_valid[slot].fill_(False)

    def move(self, src: int, dst: int) -> None:
        for t in (
            self.column,
            self.user,
            self.steps,
            self.forced,
            self.force,
            self.seed,
            self.seed_key,
            self.out,
            self.out_valid,
        ):
            t[dst] = t[src]
        for table in (self.text.tensors, self.audio.tensors):
            for t in (table.temperature, table.top_k, table.top_p, table.repetition_penalty):
                t[dst] = t[src]


@dataclass
class DepformerScratch:
    """Frame-local K/V of the depformer's inner steps, ``[layers, B, heads, steps, hd]`` (reset every frame:
    each step writes its own index before anything reads it)."""

    k: torch.Tensor
    v: torch.Tensor
    index: torch.Tensor  # [steps, B] int64: step k's cache index (k) for every row

    @classmethod
    def allocate(cls, model: PersonaPlexLM, batch: int) -> DepformerScratch:
        c = model.config
        shape = (c.depformer_num_layers, batch, c.depformer_num_heads, c.steps, c.depformer_head_dim)
        kw = {"device": model.device, "dtype": model.dtype}
        index = torch.arange(c.steps, device=model.device).unsqueeze(1).repeat(1, batch)
        return cls(torch.zeros(shape, **kw), torch.zeros(shape, **kw), index)  # type: ignore[arg-type]


def frame_step(
    model: PersonaPlexLM,
    kv: RingKV,
    state: DuplexState,
    scratch: DepformerScratch,
    b: int,
    attn_len: int,
    all_greedy: bool = False,
) -> None:
    """Step slots ``[0, b)``; results land in ``state.out`` / ``state.out_valid`` (the captured unit)."""
    h, text = temporal_part(model, kv, state, b, attn_len, all_greedy)
    agent = depformer_part(model, state, scratch, b, h, text, all_greedy)
    commit(model, state, b, torch.cat((text.unsqueeze(1), agent), dim=1))


def temporal_part(
    model: PersonaPlexLM, kv: RingKV, state: DuplexState, b: int, attn_len: int, all_greedy: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """The Helium step and the text token: ``(h [b, dim]`` after ``out_norm``, ``text [b])``."""
    steps = state.steps[:b]
    column = state.column[:b].clone()
    column[:, USER_ROW] = state.user[:b, 0]
    h = model.transformer.decode(model.embed(column), steps, kv, attn_len, model.out_norm)
    logits = model.text_linear(h)
    noise = None  # stream 0's, keyed from the slots' seed keys (``gumbel_noise``'s numbers)
    if not all_greedy:
        noise = slot_noise(state.seed_key[:b], steps, 0, logits.shape[-1])
    text = sample(
        logits,
        state.text.tensors.head(b),
        state.seed[:b],
        steps,
        stream=0,
        all_greedy=all_greedy,
        noise=noise,
    )
    return h, torch.where(state.force[:b, 0], state.forced[:b, 0], text)


def depformer_part(
    model: PersonaPlexLM,
    state: DuplexState,
    scratch: DepformerScratch,
    b: int,
    h: torch.Tensor,
    text: torch.Tensor,
    all_greedy: bool = False,
) -> torch.Tensor:
    """The agent's codebooks ``[b, 8]``, each step conditioned on the token before it (forced or sampled)."""
    steps, seed, params = state.steps[:b], state.seed[:b], state.audio.tensors.head(b)
    forced, force = state.forced[:b], state.force[:b]
    token, made = text, []
    card, n = model.linears[0].out_features, model.config.steps
    # The rows' temperature and the draws' noise (streams 1..n) once for all the codebooks, not once per
    # draw: the same numbers as each draw's own ``gumbel_noise``, a fraction of the launches.
    rows = noise = None
    if not all_greedy:
        rows = DrawRows.of(params, card, Sampler.FULL)
        noise = slot_noise(state.seed_key[:b], steps, torch.arange(1, 1 + n, device=steps.device), card)
    for k in range(n):
        x = model.depformer.step(
            model.depformer_input(k, h, token), k, scratch.k, scratch.v, scratch.index[k, :b]
        )
        logits = model.linears[k](x)
        draw_noise = None if noise is None else noise[:, k]
        token = sample(
            logits, params, seed, steps, stream=1 + k, all_greedy=all_greedy, noise=draw_noise, rows=rows
        )
        token = torch.where(force[:, 1 + k], forced[:, 1 + k], token)
        made.append(token)
    return torch.stack(made, dim=1)


def commit(model: PersonaPlexLM, state: DuplexState, b: int, new: torch.Tensor) -> None:
    """Outputs and next state of active rows from ``new [b, 9]`` (text + agent codebooks just made)."""
    active = state.active[:b]
    steps = state.steps[:b]
    a = active.unsqueeze(1)
    state.out[:b] = torch.cat((state.column[:b, :2], new[:, 2:]), dim=1)
    state.out_valid[:b] = active & (steps >= model.config.max_delay)
    nxt = torch.cat((new, state.user[:b]), dim=1)  # row 9 is replaced by the next step's user frame
    state.column[:b] = torch.where(a, nxt, state.column[:b])
    state.steps[:b] = steps + active.to(torch.int64)
    state.force[:b] = state.force[:b] & ~a
