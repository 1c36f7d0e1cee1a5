"""The load generator's pure functions: playback (underrun) simulation, Poisson schedule, percentiles."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from bench.playback import (
    NO_AUDIO,
    Playback,
    pcm_arrivals,
    percentile,
    poisson_arrivals,
    simulate_playback,
    stalls_in_client_stalls,
)

EXACT = 1e-12


def approx(p: Playback, stalls: int, total: float, worst: float, lag: float) -> None:
    assert p.stalls == stalls
    assert p.stall_total_s == pytest.approx(total, abs=EXACT)
    assert p.stall_max_s == pytest.approx(worst, abs=EXACT)
    assert p.max_lag_s == pytest.approx(lag, abs=EXACT)


def test_no_audio_and_single_chunk_never_stall() -> None:
    assert simulate_playback([], 24000) == NO_AUDIO
    assert simulate_playback([(0.3, 0), (0.4, 0)], 24000) == NO_AUDIO  # nothing playable
    approx(simulate_playback([(5.0, 48000)], 24000), 0, 0.0, 0.0, 0.0)


def test_chunks_ahead_of_playback_do_not_stall() -> None:
    # 100 ms chunks arriving every 50 ms: each is buffered before it is due; lag is never positive.
    approx(simulate_playback([(0.0, 100), (0.05, 100), (0.1, 100)], 1000), 0, 0.0, 0.0, 0.0)


def test_a_chunk_exactly_on_time_is_not_a_stall() -> None:
    approx(simulate_playback([(0.0, 8000), (0.5, 8000), (1.0, 8000)], 16000), 0, 0.0, 0.0, 0.0)


def test_late_chunks_stall_and_shift_the_rest_of_playback() -> None:
    # 80 ms chunks at 1 kHz. Chunk 2 is due at 1.08 and arrives at 1.2: a 120 ms stall, after which playback
    # resumes at 1.2, so chunk 3 (due 1.28) is in time at 1.25 and chunk 4 (due 1.36) stalls 140 ms at 1.5.
    arrivals = [(1.0, 80), (1.2, 80), (1.25, 80), (1.5, 80)]
    # Without re-buffering, chunk 4 was due at 1.24: the worst lag is 260 ms.
    approx(simulate_playback(arrivals, 1000), 2, 0.26, 0.14, 0.26)
    assert simulate_playback(arrivals, 1000).first_stall_at_s == pytest.approx(0.08)  # chunk 2
    assert simulate_playback(arrivals[:1], 1000).first_stall_at_s is None


def test_each_stall_is_kept_with_its_arrival_and_deficit() -> None:
    play = simulate_playback([(1.0, 80), (1.2, 80), (1.25, 80), (1.5, 80)], 1000)
    assert [t for t, _ in play.stall_events] == [1.2, 1.5]
    assert [d for _, d in play.stall_events] == pytest.approx([0.12, 0.14])


def test_a_stall_is_the_clients_when_its_loop_was_blocked_for_it() -> None:
    stalls = [(1.2, 0.12), (1.5, 0.17), (3.0, 0.05)]
    # The loop woke at 1.21 after 150 ms blocked: the chunk read at 1.2 (inside the block) is the client's.
    assert stalls_in_client_stalls(stalls, [(1.21, 0.15)]) == 1
    # A chunk handled just after the block (within the slack) is explained too; one long after is not.
    assert stalls_in_client_stalls(stalls, [(1.19, 0.15)]) == 1
    assert stalls_in_client_stalls(stalls, [(1.1, 0.15)]) == 0
    # A block much shorter than the deficit does not explain it (the server was late as well).
    assert stalls_in_client_stalls(stalls, [(1.5, 0.05)]) == 0
    assert stalls_in_client_stalls(stalls, [(1.5, 0.09), (3.0, 0.03)]) == 2
    assert stalls_in_client_stalls(stalls, []) == 0


def test_the_first_chunk_defines_the_start_whatever_its_absolute_time() -> None:
    late = simulate_playback([(10.0, 80), (10.2, 80)], 1000)
    early = simulate_playback([(0.0, 80), (0.2, 80)], 1000)
    approx(late, 1, 0.12, 0.12, 0.12)
    approx(early, 1, 0.12, 0.12, 0.12)


def test_tolerated_deficits_are_not_counted_but_still_delay_playback() -> None:
    # Chunk 2 is 4 ms late (tolerated) and playback shifts by 4 ms, so chunk 3, which is 6 ms behind the
    # original schedule, is only 2 ms behind the shifted one: tolerated too.
    arrivals = [(0.0, 100), (0.104, 100), (0.206, 100)]
    approx(simulate_playback(arrivals, 1000, tolerance_s=0.005), 0, 0.0, 0.0, 0.006)
    approx(simulate_playback(arrivals, 1000), 2, 0.006, 0.004, 0.006)


def test_zero_sample_events_are_ignored_and_rate_must_be_positive() -> None:
    with_empty = simulate_playback([(0.0, 80), (0.05, 0), (0.2, 80)], 1000)
    approx(with_empty, 1, 0.12, 0.12, 0.12)
    with pytest.raises(ValueError):
        simulate_playback([(0.0, 1)], 0)


def test_pcm_reads_become_whole_samples_when_completed() -> None:
    # 16-bit PCM: 3 bytes = 1 sample and a half; the half is playable only with the next byte.
    reads = [(0.0, 3), (1.0, 1), (2.0, 2), (3.0, 0), (4.0, 1)]
    assert pcm_arrivals(reads, 2) == [(0.0, 1), (1.0, 1), (2.0, 1)]
    assert pcm_arrivals([(0.0, 1)], 2) == []  # one byte: nothing playable yet


class Uniforms:
    def __init__(self, values: list[float]) -> None:
        self.values = itertools.cycle(values)

    def random(self) -> float:
        return next(self.values)


def test_poisson_gaps_are_the_inverse_transform_of_the_uniforms() -> None:
    # U = 1 - e^-x gives a gap of exactly x / rate.
    u = [1 - math.exp(-x) for x in (1.0, 0.5, 2.0)]
    got = poisson_arrivals(2.0, 2.4, Uniforms(u))
    # gaps 0.5, 0.25, 1.0, 0.5, 0.25 -> 0.5, 0.75, 1.75, 2.25; the next (2.5) is past the window
    assert got == pytest.approx([0.5, 0.75, 1.75, 2.25], abs=EXACT)
    assert poisson_arrivals(2.0, 0.4, Uniforms(u)) == []  # first arrival past the window
    assert poisson_arrivals(0.0, 100.0, Uniforms(u)) == []


def test_poisson_zero_uniform_arrives_at_once_and_max_count_bounds_the_list() -> None:
    assert poisson_arrivals(1.0, 1.0, Uniforms([0.0, 1 - math.exp(-2.0)])) == [0.0]
    assert len(poisson_arrivals(1e6, 1e6, Uniforms([0.5]), max_count=7)) == 7
    with pytest.raises(ValueError):
        poisson_arrivals(-1.0, 1.0, Uniforms([0.5]))


def test_poisson_with_a_real_generator_has_poisson_statistics() -> None:
    rate, duration = 20.0, 500.0
    a = poisson_arrivals(rate, duration, np.random.default_rng(7))
    assert a == sorted(a) and 0 <= a[0] and a[-1] < duration
    n = len(a)
    assert abs(n - rate * duration) < 5 * math.sqrt(rate * duration)  # 10000 +- 500
    gaps = np.diff([0.0, *a])
    assert gaps.mean() == pytest.approx(1 / rate, rel=0.03)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, rel=0.05)  # exponential: CV = 1
    assert poisson_arrivals(rate, duration, np.random.default_rng(7)) == a  # same seed, same schedule


def test_percentile_interpolates_like_numpy() -> None:
    values = [4.0, 1.0, 3.0, 2.0]
    assert percentile(values, 0) == 1.0
    assert percentile(values, 50) == 2.5
    assert percentile(values, 90) == pytest.approx(3.7, abs=EXACT)
    assert percentile(values, 100) == 4.0
    assert percentile([], 50) is None
    rng = np.random.default_rng(3)
    xs = list(rng.exponential(size=101))
    for q in (1, 50, 95, 99):
        assert percentile(xs, q) == pytest.approx(float(np.percentile(xs, q)), abs=EXACT)
    with pytest.raises(ValueError):
        percentile(values, 101)
