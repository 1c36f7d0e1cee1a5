"""Audio8 TTS sampler: released filter order, distribution, greedy, batch invariance, RAS, min_frames."""

from __future__ import annotations

import math

import pytest
import torch

from services.talker.models.audio8_tts.sampling import (
    COMPACT_VOCAB,
    EOS_INDEX,
    Audio8SamplingState,
    RasParams,
    compact_vocab_ids,
    draw,
    fast_noise,
    filter_top_k_top_p,
    sample_fast,
    sample_semantic,
)
from services.talker.sampling import SamplingParams, SamplingTensors, gumbel_noise, sample

RAS_OFF = RasParams(window=0)
LOW = -1e4  # a finite "never" logit


def compact(values: dict[int, float], b: int = 1) -> torch.Tensor:
    logits = torch.full((COMPACT_VOCAB,), LOW)
    for col, v in values.items():
        logits[col] = v
    return logits.expand(b, -1).clone()


def state_with(
    n: int, params: SamplingParams, ras: RasParams = RAS_OFF, min_frames: int = 0, seed0: int = 0
) -> Audio8SamplingState:
    st = Audio8SamplingState.allocate(n)
    for s in range(n):
        st.reset_slot(s, seed=seed0 + s, params=params, ras=ras, min_frames=min_frames)
    return st


def released_probs(probs: list[float], top_k: int, top_p: float, temperature: float) -> list[float]:
    """The expected distribution, written out by hand: sort, keep rank < k and inclusive cum <= top_p (the
    best always), then renormalise p^(1/T) over the kept candidates."""
    order = sorted(range(len(probs)), key=lambda i: -probs[i])
    kept, cum = [], 0.0
    for rank, i in enumerate(order):
        cum += probs[i]
        if rank == 0 or ((top_k <= 0 or rank < top_k) and (top_p >= 1.0 or cum <= top_p + 1e-9)):
            kept.append(i)
    weights = [probs[i] ** (1.0 / temperature) if i in kept else 0.0 for i in range(len(probs))]
    total = sum(weights)
    return [w / total for w in weights]


def test_filter_then_temperature_order_matters() -> None:
    # Raw p = [0.6, 0.25, 0.15], top_p 0.8: the released filter on the raw distribution keeps only token 0
    # (0.6 + 0.25 > 0.8). Tempering first (T=3 flattens to [0.42, 0.31, 0.27]) or keeping the crossing
    # token (transformers' rule) would both keep {0, 1}.
    n = 300
    logits = compact({0: math.log(0.6), 1: math.log(0.25), 2: math.log(0.15)}, n)
    params = SamplingParams(temperature=3.0, top_k=0, top_p=0.8)
    out = sample_semantic(logits, torch.arange(n), state_with(n, params), 0)
    assert (out.index == 0).all()
    temperature_first = sample(
        logits,
        SamplingTensors(
            temperature=torch.full((n,), 3.0),
            top_k=torch.zeros(n, dtype=torch.int64),
            top_p=torch.full((n,), 0.8),
            repetition_penalty=torch.ones(n),
        ),
        torch.arange(n),
        torch.zeros(n, dtype=torch.int64),
    )
    assert (temperature_first == 1).sum() > n // 10  # the other order really has a wider support


def test_filter_keeps_at_least_the_best_and_drops_the_crossing_token() -> None:
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0], [0.0, 0.0, 0.0, 0.0]])
    out = filter_top_k_top_p(logits, torch.tensor([0, 2]), torch.tensor([0.01, 1.0]))
    assert torch.isfinite(out).tolist() == [[True, False, False, False], [True, True, False, False]]


@pytest.mark.parametrize(
    ("top_k", "top_p", "temperature"),
    [(0, 1.0, 1.0), (0, 0.85, 0.8), (2, 1.0, 1.5), (4, 0.75, 0.7), (0, 0.7, 2.0)],
)
def test_draws_follow_the_truncated_tempered_softmax(top_k: int, top_p: float, temperature: float) -> None:
    probs = [0.06, 0.35, 0.10, 0.25, 0.20, 0.04]
    n = 6000
    logits = torch.tensor(probs).log().expand(n, -1)
    noise = gumbel_noise(torch.full((n,), 2024), torch.arange(n), 0, len(probs))
    tokens = draw(
        logits,
        torch.full((n,), temperature),
        torch.full((n,), top_k, dtype=torch.int64),
        torch.full((n,), top_p),
        noise,
    )
    expected = released_probs(probs, top_k, top_p, temperature)
    counts = torch.bincount(tokens, minlength=len(probs)).double()
    support = [i for i, q in enumerate(expected) if q > 0]
    assert all(counts[i] == 0 for i in range(len(probs)) if i not in support)
    chi2 = sum((float(counts[i]) - expected[i] * n) ** 2 / (expected[i] * n) for i in support)
    assert chi2 < 20.5, f"chi-square {chi2:.2f} over {len(support) - 1} dof (0.1% critical value <= 20.5)"


def test_semantic_draw_is_the_released_draw_on_stream_0() -> None:
    n = 16
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(n, COMPACT_VOCAB, generator=gen) * 3
    params = SamplingParams(temperature=0.7, top_k=50, top_p=0.9)
    st = state_with(n, params, ras=RasParams(), seed0=500)
    steps = torch.arange(n) + 3
    out = sample_semantic(logits, torch.arange(n), st, steps)
    noise = gumbel_noise(torch.arange(n) + 500, steps, 0, COMPACT_VOCAB)
    want = draw(logits, torch.full((n,), 0.7), torch.full((n,), 50), torch.full((n,), 0.9), noise)
    assert out.index.tolist() == want.tolist()  # fresh slots: RAS cannot trigger yet
    assert (out.token == out.index + 151678).all() and (out.code == out.index).all()


def test_top_k_1_and_temperature_0_are_argmax() -> None:
    n = 8
    gen = torch.Generator().manual_seed(2)
    logits = torch.randn(n, COMPACT_VOCAB, generator=gen)
    best = logits.argmax(dim=-1)
    for params in (SamplingParams(temperature=0.9, top_k=1), SamplingParams(temperature=0.0, top_k=50)):
        st = state_with(n, params, ras=RasParams())
        st.history[:, :3] = best.unsqueeze(-1)  # the argmax is "repeated", yet stays (RAS off when greedy,
        st.draws[:] = 4  # and with top_k=1 the RAS draw shares the same single candidate)
        for step in range(3):
            assert sample_semantic(logits, torch.arange(n), st, step).index.tolist() == best.tolist()
    assert sample_semantic(logits, torch.arange(n), st, 0, all_greedy=True).index.tolist() == best.tolist()
    fast_logits = torch.randn(n, 4096, generator=gen)
    st = state_with(n, SamplingParams(temperature=1.0, top_k=1))
    assert sample_fast(fast_logits, torch.arange(n), st, 0, 1).tolist() == fast_logits.argmax(-1).tolist()
    st = state_with(n, SamplingParams(do_sample=False, temperature=1.0))
    assert sample_fast(fast_logits, torch.arange(n), st, 0, 5).tolist() == fast_logits.argmax(-1).tolist()


def test_batch_invariance_alone_vs_batched_at_another_index() -> None:
    params = SamplingParams(temperature=0.8, top_k=30, top_p=0.95)
    alone = Audio8SamplingState.allocate(4)
    batched = Audio8SamplingState.allocate(4)
    alone.reset_slot(2, seed=99, params=params)
    batched.reset_slot(2, seed=99, params=params)
    for s, seed in ((0, 1), (1, 2), (3, 3)):
        batched.reset_slot(s, seed=seed, params=SamplingParams(temperature=1.2, top_k=0, top_p=0.7))
    gen = torch.Generator().manual_seed(3)
    rows = torch.tensor([3, 2, 0, 1])  # slot 2 sits at index 1 of the batch
    got_alone, got_batched = [], []
    for t in range(14):
        # Peaky logits over a few tokens so that repeats (and RAS) happen.
        row = torch.full((COMPACT_VOCAB,), LOW)
        row[:6] = torch.randn(6, generator=gen)
        others = torch.randn(3, COMPACT_VOCAB, generator=gen)
        batch = torch.stack([others[0], row, others[1], others[2]])
        a = sample_semantic(row.unsqueeze(0), torch.tensor([2]), alone, t)
        b = sample_semantic(batch, rows, batched, torch.tensor([t + 5, t, t + 1, t + 9]))
        got_alone.append(int(a.index[0]))
        got_batched.append(int(b.index[1]))
        fa = sample_fast(others[0, :4096].unsqueeze(0), torch.tensor([2]), alone, t, 3)
        fast_batch = torch.stack([others[1], others[0], others[2], row])[:, :4096]  # slot 2's at index 1
        fb = sample_fast(fast_batch, rows, batched, torch.tensor([t + 5, t, t + 1, t + 9]), 3)
        assert int(fa[0]) == int(fb[1])
    assert got_alone == got_batched
    assert len(set(got_alone)) < len(got_alone)  # repeats occurred, so RAS was exercised
    assert torch.equal(alone.history[2, :10], batched.history[2, :10])


def _ras_setup(n: int) -> tuple[torch.Tensor, Audio8SamplingState]:
    # Three equal candidates 7, 8, 9. Normal draw: top_p 0.3 keeps only the first (7). RAS draw: top_p 0.9
    # keeps {7, 8} (cum 1/3, 2/3; 9 crosses 0.9), at temperature 1.
    logits = compact({7: 0.0, 8: 0.0, 9: 0.0}, n)
    return logits, state_with(n, SamplingParams(temperature=0.7, top_k=50, top_p=0.3), ras=RasParams())


def _ras_draw(logits: torch.Tensor, st: Audio8SamplingState, step: int) -> torch.Tensor:
    n = logits.shape[0]
    noise = gumbel_noise(st.seed[:n], torch.full((n,), step), 1, COMPACT_VOCAB)
    return draw(logits, torch.full((n,), 1.0), torch.full((n,), 50), torch.full((n,), 0.9), noise)


def test_ras_replaces_a_repeated_semantic_token() -> None:
    n = 32
    logits, st = _ras_setup(n)
    rows = torch.arange(n)
    # Frame 0 is never recorded (the reference opens its window after it); frame 1 finds an empty window.
    assert (sample_semantic(logits, rows, st, 0).index == 7).all()
    assert (sample_semantic(logits, rows, st, 1).index == 7).all()
    assert (st.history[:, 0] == 7).all() and (st.history[:, 1:10] == -1).all()
    out = sample_semantic(logits, rows, st, 2).index
    high = _ras_draw(logits, st, 2)
    assert out.tolist() == high.tolist()
    assert set(out.tolist()) == {7, 8}  # replaced by the RAS draw, which is not always 7


def test_ras_leaves_non_repeats_alone_and_respects_the_window() -> None:
    n = 32
    logits, st = _ras_setup(n)
    rows = torch.arange(n)
    high = _ras_draw(logits, st, 4)
    assert (high != 7).any()
    st.history[:, :3] = torch.tensor([1, 2, 3])
    st.draws[:] = 4  # three recorded tokens, none of them 7
    assert (sample_semantic(logits, rows, st, 4).index == 7).all()
    # 7 recorded but older than a 2-token window: not a repeat; a 3-token window sees it.
    for window, expect_high in ((2, False), (3, True)):
        st = state_with(n, SamplingParams(temperature=0.7, top_k=50, top_p=0.3), ras=RasParams(window=window))
        st.history[:, :3] = torch.tensor([7, 1, 2])
        st.draws[:] = 4
        out = sample_semantic(logits, rows, st, 4).index
        assert out.tolist() == (high.tolist() if expect_high else [7] * n)


def test_ras_never_replaces_eos() -> None:
    n = 32
    logits = compact({EOS_INDEX: 0.1, 7: 0.0, 8: 0.0}, n)
    st = state_with(n, SamplingParams(temperature=0.7, top_k=50, top_p=0.3), ras=RasParams())
    st.history[:, :10] = EOS_INDEX
    st.draws[:] = 11
    assert (_ras_draw(logits, st, 0) != EOS_INDEX).any()  # the RAS draw would have changed some rows
    out = sample_semantic(logits, torch.arange(n), st, 0)
    assert out.eos.all() and (out.token == 151645).all() and (out.code == 0).all()


def test_history_ring_updates_only_active_rows() -> None:
    params = SamplingParams(temperature=1.0, top_k=0, top_p=1.0)
    ref = state_with(3, params, ras=RasParams())
    st = state_with(3, params, ras=RasParams())
    gen = torch.Generator().manual_seed(4)
    outs = []
    for t in range(15):
        row = torch.randn(COMPACT_VOCAB, generator=gen)
        r = sample_semantic(row.unsqueeze(0), torch.tensor([0]), ref, t)
        # Slot 0 active; slot 1 and a padding duplicate of slot 0 inactive.
        s = sample_semantic(
            torch.stack([row, row.roll(1), row.roll(2)]),
            torch.tensor([0, 1, 0]),
            st,
            t,
            active=torch.tensor([True, False, False]),
        )
        assert int(s.index[0]) == int(r.index[0])
        outs.append(int(r.index[0]))
    assert st.draws.tolist() == [15, 0, 0] and ref.draws[0] == 15
    assert torch.equal(st.history[0, :10], ref.history[0, :10])
    assert (st.history[1:, :10] == -1).all()
    # Ring layout: the token of draw d (d >= 1) sits in column (d - 1) % 10; draws 5..14 remain.
    assert [int(st.history[0, (d - 1) % 10]) for d in range(5, 15)] == outs[5:15]


def test_reset_slot_clears_history() -> None:
    st = state_with(2, SamplingParams(), ras=RasParams())
    st.history[1] = 5
    st.draws[1] = 7
    st.reset_slot(1, seed=3, params=SamplingParams())
    assert (st.history[1] == -1).all() and st.draws[1] == 0


def test_eos_banned_before_min_frames() -> None:
    n = 4
    logits = compact({EOS_INDEX: 10.0, 5: 0.0}, n)
    for params in (SamplingParams(temperature=0.7, top_k=50, top_p=0.9), SamplingParams(temperature=0.0)):
        st = state_with(n, params, ras=RasParams(), min_frames=3)
        for t in range(3):
            out = sample_semantic(logits, torch.arange(n), st, t)
            assert (out.index == 5).all() and not out.eos.any()
        assert sample_semantic(logits, torch.arange(n), st, 3).eos.all()
    st = state_with(n, SamplingParams(temperature=0.0), min_frames=0)
    assert sample_semantic(logits, torch.arange(n), st, 0).eos.all()
    # Per row: step below / at the row's minimum.
    st = state_with(2, SamplingParams(temperature=0.0), min_frames=2)
    assert sample_semantic(logits[:2], torch.arange(2), st, torch.tensor([1, 2])).eos.tolist() == [
        False,
        True,
    ]


def test_fast_streams_are_independent_per_codebook() -> None:
    n = 64
    logits = torch.zeros(n, 4096)
    st = state_with(n, SamplingParams(temperature=1.0, top_k=0, top_p=1.0))
    rows = torch.arange(n)
    per_book = [sample_fast(logits, rows, st, 7, k) for k in range(1, 10)]
    assert all(not torch.equal(per_book[0], other) for other in per_book[1:])
    batched = fast_noise(rows, st, 7)
    for k in range(1, 10):
        assert torch.equal(sample_fast(logits, rows, st, 7, k, noise=batched[:, k - 1]), per_book[k - 1])
    semantic_noise = gumbel_noise(st.seed, torch.full((n,), 7), 0, 4096)
    assert not torch.equal((logits + semantic_noise).argmax(-1), per_book[0])


def test_fast_uses_its_own_parameters() -> None:
    n = 8
    logits = torch.randn(n, 4096, generator=torch.Generator().manual_seed(5))
    st = Audio8SamplingState.allocate(n)
    for s in range(n):
        st.reset_slot(s, seed=s, params=SamplingParams(temperature=1.5), fast_params=SamplingParams(top_k=1))
    assert sample_fast(logits, torch.arange(n), st, 0, 2).tolist() == logits.argmax(-1).tolist()


def test_reset_slot_validation() -> None:
    st = Audio8SamplingState.allocate(2, max_window=10)
    with pytest.raises(ValueError, match="repetition_penalty"):
        st.reset_slot(0, seed=1, params=SamplingParams(repetition_penalty=1.05))
    with pytest.raises(ValueError, match="ras_window_size"):
        st.reset_slot(0, seed=1, params=SamplingParams(), ras=RasParams(window=11))
    with pytest.raises(ValueError, match="seed"):
        st.reset_slot(0, seed=2**63, params=SamplingParams())
    with pytest.raises(ValueError, match="ras_top_p"):
        RasParams(top_p=0.0)
    with pytest.raises(ValueError, match="compact logits"):
        sample_semantic(torch.zeros(1, 4096), torch.tensor([0]), st, 0)


def test_compact_vocab_ids() -> None:
    ids = compact_vocab_ids(151678, 151645)
    assert ids.shape == (4097,) and ids[0] == 151678 and ids[4095] == 155773 and ids[4096] == 151645


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_sampler_captures_as_one_cuda_graph_and_replays_exactly() -> None:
    dev = torch.device("cuda")
    n = 8
    params = SamplingParams(temperature=0.8, top_k=50, top_p=0.9)

    def fresh() -> Audio8SamplingState:
        st = Audio8SamplingState.allocate(n, dev)
        for s in range(n):
            st.reset_slot(s, seed=10 + s, params=params, min_frames=2)
        return st

    rows = torch.arange(n, device=dev)
    active = torch.ones(n, dtype=torch.bool, device=dev)
    active[-1] = False
    logits = torch.zeros(n, COMPACT_VOCAB, device=dev)
    fast_logits = torch.zeros(n, 4096, device=dev)
    step = torch.zeros(n, dtype=torch.int64, device=dev)

    def tick(st: Audio8SamplingState) -> tuple[torch.Tensor, torch.Tensor]:
        d = sample_semantic(logits, rows, st, step, active=active)
        codes = [d.code] + [sample_fast(fast_logits, rows, st, step, k) for k in range(1, 10)]
        return d.token, torch.stack(codes, dim=1)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up (caches, allocator) outside the capture
        warm = fresh()
        for _ in range(2):
            tick(warm)
    torch.cuda.current_stream().wait_stream(side)
    eager, graphed = fresh(), fresh()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out_token, out_codes = tick(graphed)
    gen = torch.Generator().manual_seed(0)
    for t in range(14):
        peaky = torch.full((n, COMPACT_VOCAB), LOW)
        peaky[:, :6] = torch.randn(n, 6, generator=gen)
        peaky[:, EOS_INDEX] = torch.randn(n, generator=gen) - 1.0
        logits.copy_(peaky)
        fast_logits.copy_(torch.randn(n, 4096, generator=gen) * 2)
        step.fill_(t)
        graph.replay()
        token, codes = tick(eager)
        assert torch.equal(out_token, token) and torch.equal(out_codes, codes)
    assert torch.equal(graphed.history, eager.history) and torch.equal(graphed.draws, eager.draws)
    assert graphed.draws.tolist() == [14] * (n - 1) + [0]
