"""Pure functions of the load generator: playback simulation, arrival schedules and percentiles.

Nothing here does I/O or reads a clock, so every result is exact for given inputs (tests/bench/).

Playback model (Nari tts_bench ``evaluate_playback``; performance.md §2.1): a player starts at the first
playable sample with **no prebuffer** and plays at the nominal sample rate. A chunk whose first sample is due
before the chunk has arrived is an underrun (a stall): the player waits for it, the wait is the deficit, and
everything after it plays that much later. ``max_lag_s`` is vLLM-Omni's ``audio_underrun`` instead: the worst
deficit against the original schedule, with no shift after a stall.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class Playback:
    stalls: int  # chunks that arrived after their play time (by more than the tolerance)
    stall_total_s: float  # sum of those deficits: how long the listener heard nothing mid-stream
    stall_max_s: float  # the longest single stall
    max_lag_s: float  # worst deficit without re-buffering (vLLM-Omni audio_underrun); 0 when always early
    # Audio position (s) where the first stall hit: 0.08 is the chunk after a one-frame first chunk.
    first_stall_at_s: float | None = None
    stall_events: tuple[tuple[float, float], ...] = ()  # (arrival time s, deficit s) of each stall


NO_AUDIO = Playback(0, 0.0, 0.0, 0.0)


def simulate_playback(
    arrivals: Sequence[tuple[float, int]], sample_rate: int, *, tolerance_s: float = 0.0
) -> Playback:
    """Replay ``(arrival time s, new playable samples)`` events, in arrival order, through the player.

    Events with zero samples are ignored (a header or a half sample is not playable). Deficits of at most
    ``tolerance_s`` still delay playback but are not counted as stalls.
    """
    if sample_rate <= 0:
        raise ValueError(f"sample_rate must be positive, got {sample_rate}")
    events = [(t, n) for t, n in arrivals if n > 0]
    if not events:
        return NO_AUDIO
    start = events[0][0]
    # The due time of the next sample is kept as (resume time, samples played since): one division per
    # event instead of a running float sum, so a chunk that is exactly on time is not a stall by rounding.
    base_t, base_played = start, 0
    played = 0
    total, worst, lag = 0.0, 0.0, 0.0
    stalled: list[tuple[float, float]] = []
    first: float | None = None
    for t, n in events:
        due = base_t + (played - base_played) / sample_rate
        if t > due:
            deficit = t - due
            if deficit > tolerance_s:
                stalled.append((t, deficit))
                first = played / sample_rate if first is None else first
                total += deficit
                worst = max(worst, deficit)
            base_t, base_played = t, played  # the player waited; it resumes on arrival
        lag = max(lag, t - (start + played / sample_rate))
        played += n
    return Playback(len(stalled), total, worst, lag, first, tuple(stalled))


# A chunk the client's loop read late reaches the player up to this long after the loop woke (the events
# queued behind the block are handled first).
CLIENT_STALL_SLACK_S = 0.02


def stalls_in_client_stalls(
    stalls: Sequence[tuple[float, float]], loop_stalls: Sequence[tuple[float, float]]
) -> int:
    """How many playback stalls ``(arrival, deficit)`` the client's own event loop explains: the loop was
    blocked (``loop_stalls``: ``(woke at, blocked for)``, the same clock as the arrivals) for at least half
    the deficit, and the chunk arrived while it was blocked or within ``CLIENT_STALL_SLACK_S`` after it
    woke. Such a stall is the load client's, not the server's."""
    return sum(
        1
        for t, deficit in stalls
        if any(
            blocked >= deficit / 2 and woke - blocked <= t <= woke + CLIENT_STALL_SLACK_S
            for woke, blocked in loop_stalls
        )
    )


class UniformSource(Protocol):
    def random(self) -> float: ...


def poisson_arrivals(
    rate: float, duration_s: float, rng: UniformSource, *, max_count: int = 1_000_000
) -> list[float]:
    """Arrival offsets (s, ascending, in ``[0, duration_s)``) of a Poisson process of ``rate`` per second.

    Gaps are exponential by inverse transform, ``-ln(1 - U) / rate`` with ``U = rng.random()``, so a test can
    feed chosen uniforms and know every arrival exactly. ``max_count`` bounds the list whatever the inputs.
    """
    if rate < 0 or duration_s < 0:
        raise ValueError(f"rate and duration must be >= 0, got {rate}, {duration_s}")
    out: list[float] = []
    if rate == 0:
        return out
    t = 0.0
    while len(out) < max_count:
        t += -math.log1p(-rng.random()) / rate
        if t >= duration_s:
            break
        out.append(t)
    return out


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0..100) with linear interpolation between order statistics (numpy's default);
    None for no values."""
    if not 0 <= q <= 100:
        raise ValueError(f"q must be in [0, 100], got {q}")
    if not values:
        return None
    ordered = sorted(values)
    rank = q / 100 * (len(ordered) - 1)
    lo = math.floor(rank)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (rank - lo)


def pcm_arrivals(chunks: Sequence[tuple[float, int]], bytes_per_sample: int) -> list[tuple[float, int]]:
    """``(time, bytes)`` reads of a PCM byte stream as ``(time, new whole samples)``: a sample split across
    two reads becomes playable with the read that completes it."""
    out: list[tuple[float, int]] = []
    total = 0
    for t, nbytes in chunks:
        before = total // bytes_per_sample
        total += nbytes
        new = total // bytes_per_sample - before
        if new:
            out.append((t, new))
    return out
