"""One Audio8-TTS frame for slots ``[0, b)``, entirely on device (models.md §2.4, the per-frame loop).

A slot's state is its pending slow-AR input (``ids`` row 0 and the 10 ``codes``), the position it goes to,
and its sampler row. Step for each row:

1. the input embedding ``embeddings(id) + sum_k codebook_embeddings(code_k + 4096 k)`` (codes only where
   the id is semantic) through the slow AR at the row's position: ``h`` (post final norm);
2. compact logits over the 4096 semantic tokens + ``<|im_end|>`` from the tied head, the semantic token
   sampled with RAS (``sampling.sample_semantic``);
3. the fast AR on a frame-local 10-position cache: positions 0 and 1 (``fast_project_in(h)`` primes the
   cache, ``fast_embeddings(semantic code)``) run as one 2-token forward giving code 1, then positions
   2..9 (``fast_embeddings(previous code)``) give codes 2..9; each sampled over 4096 classes;
4. the frame ``[semantic code, code 1..9]`` goes out and becomes the row's next input ``[token, codes]``.

End of an utterance: ``<|im_end|>`` sampled, or the row's position reaching ``max_seq_len - 1``: the
reference stops once prompt + frames fill ``max_seq_len`` positions, so a step at the last position would
make a frame the reference never makes, and it reports EOS instead.

Rows with ``active`` false keep all of their state (their K/V lands at their own parking position, which
their next real step overwrites first; their RAS history is not touched). No ``.item()``, no
value-dependent Python branches: one call is one CUDA graph per (b, attn_len) bucket. Randomness is
counter-based, keyed by (seed, frame index, stream), so a seeded request samples the same alone or batched.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from .model import Audio8TTSModel, KVPool
from .sampling import Audio8SamplingState, fast_noise, sample_fast, sample_semantic


@dataclass
class FrameState:
    """Per-slot decode state ``[S, ...]`` on the model's device, owned by the adapter."""

    next_ids: torch.Tensor  # [S] int64: row 0 of the pending slow-AR input
    next_codes: torch.Tensor  # [S, Q] int64: its codes (used only where the id is semantic)
    positions: torch.Tensor  # [S] int64: the pending input's absolute position
    frames: torch.Tensor  # [S] int64: frames produced (the sampler's step and min-frames clock)
    active: torch.Tensor  # [S] bool: rows that advance in this step
    rows: torch.Tensor  # [S] int64: arange, the slot of each row of a packed batch
    codes_out: torch.Tensor  # [S, Q] int64: the last step's frame
    eos_out: torch.Tensor  # [S] bool
    sampling: Audio8SamplingState

    @classmethod
    def allocate(cls, model: Audio8TTSModel, num_slots: int) -> FrameState:
        c, dev = model.config, model.device

        def zeros(*shape: int, dtype: torch.dtype = torch.int64) -> torch.Tensor:
            return torch.zeros(shape, dtype=dtype, device=dev)

        return cls(
            next_ids=torch.full((num_slots,), c.pad_token_id, dtype=torch.int64, device=dev),
            next_codes=zeros(num_slots, c.num_codebooks),
            positions=zeros(num_slots),
            frames=zeros(num_slots),
            active=zeros(num_slots, dtype=torch.bool),
            rows=torch.arange(num_slots, device=dev),
            codes_out=zeros(num_slots, c.num_codebooks),
            eos_out=zeros(num_slots, dtype=torch.bool),
            sampling=Audio8SamplingState.allocate(
                num_slots,
                dev,
                max_window=max(c.ras_window_size, 1),
                semantic_begin_id=c.semantic_begin_id,
                eos_token_id=c.eos_token_id,
            ),
        )

    def reset_slot(self, slot: int, pad_id: int) -> None:
        """A new request in ``slot`` (host-side writes at admission): a harmless pending input (a masked
        decode row of a slot still prefilling embeds it), position and frame clock at 0."""
        self.next_ids[slot].fill_(pad_id)
        self.next_codes[slot].fill_(0)
        self.positions[slot].fill_(0)
        self.frames[slot].fill_(0)

    def move(self, src: int, dst: int) -> None:
        """Copy every per-slot row, sampler included, from ``src`` to ``dst``."""
        for t in (self.next_ids, self.next_codes, self.positions, self.frames):
            t[dst] = t[src]
        for f in dataclasses.fields(self.sampling):
            value = getattr(self.sampling, f.name)
            if isinstance(value, torch.Tensor):
                value[dst] = value[src]


def frame_step(
    model: Audio8TTSModel, kv: KVPool, fast_kv: KVPool, st: FrameState, b: int, attn_len: int
) -> None:
    """Step slots ``[0, b)`` over ``kv`` positions ``[0, attn_len)``; results in ``st.codes_out`` /
    ``st.eos_out``, next inputs and clocks of active rows advanced (the captured unit)."""
    c = model.config
    q = c.num_codebooks
    rows, active, pos, t = st.rows[:b], st.active[:b], st.positions[:b], st.frames[:b]
    x = model.embed(st.next_ids[:b], st.next_codes[:b]).unsqueeze(1)
    normed, residual = model.slow(x, pos.unsqueeze(1), kv, None, attn_len)
    normed, residual = normed[:, 0], residual[:, 0]
    sem = sample_semantic(model.logits(normed), rows, st.sampling, t, active=active)

    noise = fast_noise(rows, st.sampling, t, q)  # [b, Q-1, 4096]: codebooks 1..Q-1 in one call
    start = torch.stack((model.fast_start(normed, residual), model.fast_embeddings(sem.code)), dim=1)
    h = model.fast(start, torch.arange(2, device=x.device).expand(b, 2), fast_kv, attn_len=2)
    code = sample_fast(model.fast_logits(h[:, 1]), rows, st.sampling, t, 1, noise=noise[:, 0])
    codes = [sem.code, code]
    for k in range(2, q):
        position = torch.full((b, 1), k, dtype=torch.int64, device=x.device)
        h = model.fast(model.fast_embeddings(code).unsqueeze(1), position, fast_kv, attn_len=k + 1)
        code = sample_fast(model.fast_logits(h[:, 0]), rows, st.sampling, t, k, noise=noise[:, k - 1])
        codes.append(code)
    frame = torch.stack(codes, dim=1)

    a = active.unsqueeze(1)
    st.codes_out[:b] = frame
    st.eos_out[:b] = active & (sem.eos | (pos >= c.max_seq_len - 1))
    st.next_ids[:b] = torch.where(active, sem.token, st.next_ids[:b])
    st.next_codes[:b] = torch.where(a, frame, st.next_codes[:b])
    st.positions[:b] = pos + active.to(torch.int64)
    st.frames[:b] = t + active.to(torch.int64)
