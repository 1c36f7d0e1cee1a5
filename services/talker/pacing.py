"""Pacing under load (``pace_realtime_x``, ``pace_ahead_s``): when to hold a text-to-speech talker's frame
steps so that a GPU it shares with the codec is not spent on audio nobody hears for seconds.

In a closed loop the talker runs flat out: about 100 frame steps a second at 16-128 streams on an H200 (a
step costs nearly the same at any batch), every stream generated many times faster than it is played, and
the codec decodes all of it, while young streams' chunks wait behind both stages' kernels (docs/benchmarks.md,
fourth session). Under load (at least ``from_streams`` requests in slots) these rules apply:

* **Spaced steps** (``min_step_interval_s``): a frame step starts at most once per frame period / x, so the
  talker's own GPU time is bounded while every stream still gets x times real time, enough for the chunk
  ramp (x > 2) and young streams' first chunks.
* **Held streams** (``ahead_s``): a stream more than ``ahead_s`` of audio ahead of real time since its first
  frame skips steps (its row runs masked, as for a stream starved of text) until real time catches up, so
  audio is generated, and decoded, about as fast as it is heard. When every stream is held, no step runs.
* **Riding streams** (``ride_s``): a frame step over a batch bucket costs the same whether a row in it is
  masked or not, so holding saves device time only when it holds every stream. With ``ride_s``, a stream
  more than ``ahead_s`` ahead no longer starts a step, but rides along in one that runs anyway until it is
  ``ahead_s + ride_s`` ahead. Streams then fall into step together: at 256 streams past their ramp, one
  step every frame period moves them all, where held streams that come due one by one asked for a step at
  every interval, each masking most of its rows (``bench/results/next_lease`` measures it).

The frames are the same either way (each frame is a function of its position and seed, not of when it
runs). Below ``from_streams`` neither applies, so a lone request is as fast as unpaced.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Pacing:
    min_step_interval_s: float = 0.0  # 0: steps as often as the engine can
    ahead_s: float = 0.0  # 0: no stream is held
    ride_s: float = 0.0  # how far past ahead_s a held stream still rides along in a step that runs anyway
    from_streams: int = 1  # requests in slots that count as load
    frame_s: float = 0.08  # audio per frame (the family's frame period)

    @property
    def on(self) -> bool:
        return self.min_step_interval_s > 0.0 or self.ahead_s > 0.0

    def step_wait(self, slots: int, last_launch: float, now: float) -> float:
        """Seconds until the next frame step may start (0: now, or not under load)."""
        if self.min_step_interval_s <= 0.0 or slots < self.from_streams:
            return 0.0
        return max(0.0, last_launch + self.min_step_interval_s - now)

    def hold_left(self, slots: int, first_frame_at: float | None, launched: int, now: float) -> float:
        """Seconds a stream stays held: how far its ``launched`` frames run ahead of real time since its
        first frame, beyond ``ahead_s`` (0: it may step now)."""
        if self.ahead_s <= 0.0 or slots < self.from_streams or first_frame_at is None:
            return 0.0
        return max(0.0, launched * self.frame_s - (now - first_frame_at) - self.ahead_s)

    def rides(self, hold_left: float) -> bool:
        """Whether a stream held for ``hold_left`` seconds still steps in a step that runs anyway."""
        return hold_left <= self.ride_s


def pacing_warnings(
    ahead_s: float | None, realtime_x: float | None, steady_frames: int, ramp: bool, frame_rate_hz: float
) -> list[str]:
    """Settings that would starve the chunk schedule, said at the talker's start: a held stream keeps only
    ``pace_ahead_s`` of frames ahead of real time while a steady chunk decodes once all its frames are in,
    and a ramp chunk is as long as the audio before it, so its frames must come faster than twice real
    time."""
    out = []
    steady_s = steady_frames / frame_rate_hz
    if ahead_s is not None and ahead_s <= steady_s:
        out.append(
            f"stages[0].pace_ahead_s is {ahead_s:g} s, not more than one steady chunk ({steady_frames} "
            f"frames, {steady_s:g} s): a held stream's next chunk is whole only after its listener needs it, "
            "so streams will underrun under load; give it a chunk and a margin"
        )
    if realtime_x is not None and realtime_x <= 2.0 and ramp:
        out.append(
            f"stages[0].pace_realtime_x is {realtime_x:g}: with the chunk ramp on, each ramp chunk is as "
            "long as the audio before it, so its frames must come faster than twice real time; young "
            "streams will underrun under load"
        )
    return out
