"""Pacing under load (``pace_realtime_x``, ``pace_ahead_s``): when to hold a text-to-speech talker's frame
steps so that a GPU it shares with the codec is not spent on audio nobody hears for seconds.

In a closed loop the talker runs flat out: about 100 frame steps a second at 16-128 streams on an H200 (a
step costs nearly the same at any batch), every stream generated many times faster than it is played, and
the codec decodes all of it, while young streams' chunks wait behind both stages' kernels (docs/benchmarks.md,
fourth session). Under load (at least ``from_streams`` requests in slots) two rules apply:

* **Spaced steps** (``min_step_interval_s``): a frame step starts at most once per frame period / x, so the
  talker's own GPU time is bounded while every stream still gets x times real time, enough for the chunk
  ramp (x > 2) and young streams' first chunks.
* **Held streams** (``ahead_s``): a stream more than ``ahead_s`` of audio ahead of real time since its first
  frame skips steps (its row runs masked, as for a stream starved of text) until real time catches up, so
  audio is generated, and decoded, about as fast as it is heard. When every stream is held, no step runs.

The frames are the same either way (each frame is a function of its position and seed, not of when it
runs). Below ``from_streams`` neither applies, so a lone request is as fast as unpaced.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Pacing:
    min_step_interval_s: float = 0.0  # 0: steps as often as the engine can
    ahead_s: float = 0.0  # 0: no stream is held
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
