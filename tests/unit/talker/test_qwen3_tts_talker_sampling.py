"""Sampling: distribution, seeded batch invariance, top-k/top-p masks, penalty and greedy rules."""

from __future__ import annotations

import math

import pytest
import torch

from services.talker.sampling import (
    TOP_K_CAP,
    DrawRows,
    Sampler,
    SamplingParams,
    SamplingTensors,
    apply_repetition_penalty,
    filter_top_k,
    filter_top_k_top_p,
    gumbel_from_keys,
    gumbel_noise,
    sample,
    seed_key,
    seed_keys,
    slot_noise,
    step_keys,
    step_keys_from,
    stream_keys,
    uniform_noise,
    unit_from_bits,
)


def rows(
    n: int, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0, penalty: float = 1.0
) -> SamplingTensors:
    return SamplingTensors(
        temperature=torch.full((n,), temperature),
        top_k=torch.full((n,), top_k, dtype=torch.int64),
        top_p=torch.full((n,), top_p),
        repetition_penalty=torch.full((n,), penalty),
    )


def test_draws_follow_the_softmax_distribution() -> None:
    probs = torch.tensor([0.05, 0.10, 0.15, 0.20, 0.22, 0.28])
    n = 6000
    logits = probs.log().expand(n, -1)
    steps = torch.arange(n)
    tokens = sample(logits, rows(n), torch.full((n,), 1234), steps, stream=3)
    counts = torch.bincount(tokens, minlength=6).double()
    expected = probs.double() * n
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 20.5, f"chi-square {chi2:.2f} exceeds the 0.1% critical value for 5 dof"


def test_temperature_sharpens_the_distribution() -> None:
    probs = torch.tensor([0.1, 0.2, 0.7])
    n = 4000
    logits = probs.log().expand(n, -1)
    tokens = sample(logits, rows(n, temperature=0.5), torch.full((n,), 9), torch.arange(n))
    freq = torch.bincount(tokens, minlength=3).double() / n
    sharpened = probs.double() ** 2 / (probs.double() ** 2).sum()
    assert torch.allclose(freq, sharpened, atol=0.03)


def test_uniform_noise_is_uniform_and_keyed() -> None:
    u = uniform_noise(torch.tensor([7, 7, 8]), torch.tensor([0, 1, 0]), 0, 50000)
    assert float(u.min()) > 0.0 and float(u.max()) < 1.0
    for row in u:
        assert abs(float(row.mean()) - 0.5) < 0.01
        assert abs(float(row.var()) - 1 / 12) < 0.005
    # Different step, seed or stream -> unrelated noise.
    assert float(torch.corrcoef(u)[0, 1].abs()) < 0.02
    assert float(torch.corrcoef(u)[0, 2].abs()) < 0.02
    other_stream = uniform_noise(torch.tensor([7]), torch.tensor([0]), 1, 50000)
    assert not torch.equal(other_stream[0], u[0])


@pytest.mark.parametrize("temperature,top_k,top_p", [(0.9, 50, 1.0), (1.3, 0, 0.8), (0.7, 5, 0.9)])
def test_seeded_draw_is_batch_invariant(temperature: float, top_k: int, top_p: float) -> None:
    gen = torch.Generator().manual_seed(0)
    vocab = 300
    mine = torch.randn(vocab, generator=gen) * 3
    alone = sample(
        mine[None], rows(1, temperature, top_k, top_p), torch.tensor([42]), torch.tensor([17]), stream=2
    )
    for position in (0, 3, 7):
        batch = torch.randn(8, vocab, generator=gen) * 3
        batch[position] = mine
        seeds = torch.randint(0, 2**40, (8,), generator=gen)
        steps = torch.randint(0, 100, (8,), generator=gen)
        seeds[position], steps[position] = 42, 17
        params = rows(8, temperature, top_k, top_p)
        params.temperature[(position + 1) % 8] = 0.0  # a greedy neighbour changes nothing either
        drawn = sample(batch, params, seeds, steps, stream=2)
        assert int(drawn[position]) == int(alone[0])


def test_same_seed_and_step_repeat_different_steps_vary() -> None:
    logits = torch.zeros(1, 1000)
    params = rows(1)
    a = [int(sample(logits, params, torch.tensor([5]), torch.tensor([s]))[0]) for s in range(20)]
    b = [int(sample(logits, params, torch.tensor([5]), torch.tensor([s]))[0]) for s in range(20)]
    c = [int(sample(logits, params, torch.tensor([6]), torch.tensor([s]))[0]) for s in range(20)]
    assert a == b
    assert len(set(a)) > 10
    assert a != c


def _hf_filter(scores: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """transformers' TopK then TopP warpers, row by row (the behaviour we must match)."""
    out = scores.clone()
    if top_k > 0:
        k = min(top_k, out.shape[-1])
        out = out.masked_fill(out < torch.topk(out, k)[0][..., -1, None], float("-inf"))
    if top_p < 1.0:
        sorted_logits, idx = torch.sort(out, descending=False)
        cum = sorted_logits.softmax(-1).cumsum(-1)
        remove = cum <= (1 - top_p)
        remove[..., -1:] = False
        out = out.masked_fill(remove.scatter(-1, idx, remove), float("-inf"))
    return out


@pytest.mark.parametrize(
    "top_k,top_p", [(0, 1.0), (1, 1.0), (7, 1.0), (0, 0.5), (10, 0.9), (3, 0.05), (500, 0.99)]
)
def test_top_k_top_p_masks_match_transformers(top_k: int, top_p: float) -> None:
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(4, 64, generator=gen) * 2
    if top_p == 1.0:
        # Ties at the k-th value all survive top-k; under top-p, which tied token sorts last is unspecified.
        logits[1, 5] = logits[1, 9] = logits[1].max() + 1
    ours = filter_top_k_top_p(logits, torch.full((4,), top_k), torch.full((4,), top_p))
    for r in range(4):
        theirs = _hf_filter(logits[r : r + 1], top_k, top_p)[0]
        assert torch.equal(torch.isinf(ours[r]), torch.isinf(theirs)), f"row {r}"
        assert torch.equal(ours[r][~torch.isinf(ours[r])], theirs[~torch.isinf(theirs)])


def test_per_row_parameters_apply_to_their_rows_only() -> None:
    logits = torch.arange(10, dtype=torch.float32).expand(2, -1)
    masked = filter_top_k_top_p(logits, torch.tensor([2, 0]), torch.tensor([1.0, 1.0]))
    assert int(torch.isfinite(masked[0]).sum()) == 2
    assert bool(torch.isfinite(masked[1]).all())
    params = rows(2, temperature=1.0)
    params.top_k = torch.tensor([1, 0])
    for step in range(10):
        drawn = sample(logits, params, torch.tensor([1, 1]), torch.tensor([step, step]))
        assert int(drawn[0]) == 9


def test_repetition_penalty_follows_transformers_rule() -> None:
    logits = torch.tensor([[2.0, -2.0, 1.0, -1.0]])
    seen = torch.tensor([[True, True, False, False]])
    out = apply_repetition_penalty(logits, seen, torch.tensor([2.0]))
    assert out.tolist() == [[1.0, -4.0, 1.0, -1.0]]


def test_greedy_uses_penalty_and_bans_but_no_noise() -> None:
    logits = torch.tensor([[3.0, 2.9, 0.0, 5.0]])
    params = rows(1, temperature=0.0, penalty=1.1)
    seen = torch.tensor([[True, False, False, False]])
    banned = torch.tensor([False, False, False, True])
    for step in range(5):
        tok = sample(logits, params, torch.tensor([step]), torch.tensor([step]), seen=seen, banned=banned)
        assert int(tok[0]) == 1  # 3.0 / 1.1 < 2.9, and 3 is banned


def test_all_greedy_shortcut_gives_the_same_tokens() -> None:
    gen = torch.Generator().manual_seed(5)
    logits = torch.randn(6, 100, generator=gen)
    seen = torch.rand(6, 100, generator=gen) < 0.2
    params = rows(6, temperature=0.0, top_k=10, top_p=0.5, penalty=1.3)
    args = (logits, params, torch.arange(6), torch.arange(6))
    assert torch.equal(sample(*args, seen=seen), sample(*args, seen=seen, all_greedy=True))


def test_banned_tokens_are_never_drawn() -> None:
    logits = torch.zeros(500, 8)
    banned = torch.zeros(8, dtype=torch.bool)
    banned[2:6] = True
    tokens = sample(logits, rows(500), torch.full((500,), 3), torch.arange(500), banned=banned)
    assert not bool(banned[tokens].any())


def test_sampling_params_validation_names_the_field() -> None:
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(top_p=0.0)
    with pytest.raises(ValueError, match="temperature"):
        SamplingParams(temperature=-1.0)
    with pytest.raises(ValueError, match="top_k"):
        SamplingParams(top_k=-2)
    with pytest.raises(ValueError, match="repetition_penalty"):
        SamplingParams(repetition_penalty=0.0)
    assert SamplingParams(do_sample=False, temperature=0.9).effective_temperature == 0.0
    assert math.isclose(SamplingParams(temperature=0.9).effective_temperature, 0.9)


def test_batched_stream_noise_equals_per_stream_noise() -> None:
    seed, step = torch.tensor([7, -3, 2**40 + 5]), torch.tensor([0, 11, 4])
    batched = gumbel_from_keys(stream_keys(step_keys(seed, step), torch.arange(1, 16)), 300)
    assert batched.shape == (3, 15, 300)
    for g in range(1, 16):
        assert torch.equal(batched[:, g - 1], gumbel_noise(seed, step, g, 300))
    assert torch.equal(
        gumbel_from_keys(stream_keys(step_keys(seed, step), 0), 300), gumbel_noise(seed, step, 0, 300)
    )


SEEDS = [0, 1, -1, 7, 2**31, 2**32 + 9, 2**63 - 1, -(2**63), 123456789123456789, -987654321987]


def test_a_seed_key_on_the_host_is_the_device_one() -> None:
    """Slots keep ``seed_key(seed)`` written at admission; a step mixes in only its step."""
    device = seed_keys(torch.tensor(SEEDS, dtype=torch.int64))
    assert device.tolist() == [seed_key(s) for s in SEEDS]
    assert all(0 <= k < 2**32 for k in device.tolist())


def test_step_keys_from_seed_keys_are_the_three_round_hash() -> None:
    """The keys every seeded draw has used: the seed's low word, its high word, then the step, one mixing
    round each (written out here, independently of how ``sampling`` composes them)."""
    from services.talker.sampling import _GOLDEN, _M32, _mix32

    seed = torch.tensor(SEEDS, dtype=torch.int64)
    step = torch.arange(len(SEEDS), dtype=torch.int64) * 37
    h = _mix32((seed & _M32) ^ _GOLDEN)
    h = _mix32(h ^ ((seed >> 32) & _M32))
    want = _mix32(h ^ (step & _M32))
    assert torch.equal(step_keys(seed, step), want)
    host_keys = torch.tensor([seed_key(s) for s in SEEDS], dtype=torch.int64)
    assert torch.equal(step_keys_from(host_keys, step), want)
    # The draws of one step from the slots' seed keys (``slot_noise``), batched over streams: each draw's
    # own noise.
    batched = slot_noise(host_keys, step, torch.arange(1, 9), 64)
    for k in range(1, 9):
        assert torch.equal(batched[:, k - 1], gumbel_noise(seed, step, k, 64))


def test_noise_is_finite_at_the_extreme_hashes() -> None:
    u = unit_from_bits(torch.tensor([0, 0xFFFFFFFF, 0x7FFFFFFF], dtype=torch.int64))
    assert bool(((u > 0) & (u < 1)).all())
    assert bool(torch.isfinite(-torch.log(-torch.log(u))).all())
    # The draw that found it: seed 19, frame 60, stream 0 hashed column 2765 to the top 24-bit value, whose
    # noise was +inf; that column is a banned c0 id, so -inf + inf = NaN won the argmax.
    noise = gumbel_noise(torch.tensor([19]), torch.tensor([60]), 0, 3072)
    assert bool(torch.isfinite(noise).all())
    logits = torch.zeros(1, 3072)
    banned = torch.zeros(3072, dtype=torch.bool)
    banned[2048:] = True
    token = sample(
        logits, rows(1, temperature=0.9, top_k=50), torch.tensor([19]), torch.tensor([60]), banned=banned
    )
    assert int(token) < 2048


def _random_logits(rows: int, vocab: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, vocab, generator=gen) * 3
    # Ties (a coarse grid makes many equal values, also at the k-th place) and banned tokens.
    logits[: rows // 2] = (logits[: rows // 2] * 2).round() / 2
    logits[::3, ::7] = float("-inf")
    return logits


@pytest.mark.parametrize("vocab", [40, 2048, 3072])
def test_selection_top_k_equals_the_sorted_path(vocab: int) -> None:
    logits = _random_logits(96, vocab, seed=vocab)
    gen = torch.Generator().manual_seed(1)
    top_k = torch.randint(-1, TOP_K_CAP + 1, (96,), generator=gen)
    top_k[:4] = torch.tensor([0, 1, TOP_K_CAP, min(TOP_K_CAP, vocab)])
    want = filter_top_k_top_p(logits, top_k, torch.ones(96))
    assert torch.equal(filter_top_k(logits, top_k), want)
    assert bool(torch.isinf(want[5:]).any())  # the filter really removed tokens


@pytest.mark.parametrize("vocab", [2048, 3072])
def test_sampler_variants_draw_what_the_full_path_draws(vocab: int) -> None:
    n = 64
    logits = _random_logits(n, vocab, seed=7)
    gen = torch.Generator().manual_seed(2)
    params = SamplingTensors(
        temperature=torch.rand(n, generator=gen) + 0.2,
        top_k=torch.randint(0, TOP_K_CAP + 1, (n,), generator=gen),
        top_p=torch.ones(n),
        repetition_penalty=torch.full((n,), 1.05),
    )
    params.temperature[::5] = 0.0  # greedy rows mixed in
    seen = torch.rand(n, vocab, generator=gen) < 0.05
    seeds, steps = torch.arange(n) * 31 + 5, torch.arange(n) % 9

    def draw(sampler: Sampler, p: SamplingTensors = params) -> torch.Tensor:
        return sample(logits, p, seeds, steps, stream=3, seen=seen, sampler=sampler)

    full = draw(Sampler.FULL)
    assert torch.equal(draw(Sampler.TOP_K), full)
    greedy = SamplingTensors(torch.zeros(n), params.top_k, params.top_p, params.repetition_penalty)
    assert torch.equal(draw(Sampler.GREEDY, greedy), draw(Sampler.FULL, greedy))
    assert not torch.equal(full, draw(Sampler.FULL, greedy))  # the sampled rows really sample


@pytest.mark.parametrize("sampler", [Sampler.TOP_K, Sampler.FULL])
def test_draw_rows_made_once_draw_what_each_draw_derives_itself(sampler: Sampler) -> None:
    """A frame's code-predictor groups share ``DrawRows``: every group draws the tokens it would draw with
    its own derivation (greedy rows mixed in)."""
    n, vocab = 16, 2048
    gen = torch.Generator().manual_seed(3)
    params = SamplingTensors(
        temperature=torch.rand(n, generator=gen) + 0.3,
        top_k=torch.randint(0, TOP_K_CAP + 1, (n,), generator=gen),
        top_p=torch.ones(n) if sampler is Sampler.TOP_K else torch.full((n,), 0.8),
        repetition_penalty=torch.ones(n),
    )
    params.temperature[::4] = 0.0
    shared = DrawRows.of(params, vocab, sampler)
    seeds, steps = torch.arange(n) * 7 + 1, torch.arange(n) % 5
    for group in range(1, 4):
        logits = _random_logits(n, vocab, seed=group)
        own = sample(logits, params, seeds, steps, stream=group, sampler=sampler)
        given = sample(logits, params, seeds, steps, stream=group, sampler=sampler, rows=shared)
        assert torch.equal(given, own)
    if sampler is Sampler.FULL:  # no top-k columns were made for it: a top-k draw must not take them
        with pytest.raises(AssertionError, match="another sampler"):
            sample(logits, params, seeds, steps, sampler=Sampler.TOP_K, rows=shared)


def test_sampler_variant_is_the_least_specialised_of_a_batch() -> None:
    greedy = SamplingParams(do_sample=False, top_p=0.5)
    top_k = SamplingParams(temperature=0.9, top_k=50)
    assert Sampler.for_params([greedy, greedy]) is Sampler.GREEDY
    assert Sampler.for_params([greedy, top_k]) is Sampler.TOP_K
    assert Sampler.for_params([SamplingParams(temperature=0.9)]) is Sampler.TOP_K  # top-k off
    assert Sampler.for_params([top_k, SamplingParams(top_k=TOP_K_CAP + 1)]) is Sampler.FULL
    assert Sampler.for_params([top_k, SamplingParams(top_p=0.95)]) is Sampler.FULL
