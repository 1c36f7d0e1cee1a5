"""When a joining session's prefill call may run: in the gap of the codec's tick, never across a live step.

The codec sends every session's user frame of a tick at once, every ``tick_s``; the talker steps on them, and
the codec then decodes the step's frames on the same GPU. A prefill call that is still running when the next
tick's frames arrive delays every live session's step by what is left of it, and a player with no prebuffer
hears that as a late frame (H200, 71 sessions joining at once: 39 ms stalls of the earliest joiners, whose
steps waited behind two prefill calls). So while sessions are live, a call starts only

- after the last step plus ``after_step_s`` (the codec's decode of that step has the GPU), and
- if its expected duration ends ``before_tick_s`` ahead of the next tick's frames (the codec's encode),

and at least one call runs per tick whatever its fit, so joins always progress. With no live session there is
nobody to delay and calls run back to back. A tick whose frames do not come within half a tick of their time
(the codec skipped it) no longer holds calls back.

The next tick is predicted from the start of the last burst of user frames; a call's duration is a moving
average of measured calls (7B eager prefill calls are launch-bound: 15 ms for one prompt, 19 ms for eight).
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass
class PrefillWindow:
    tick_s: float
    after_step_s: float
    before_tick_s: float
    call_s: float  # expected seconds of one prefill call (measured calls update it)
    _arrived: float | None = None  # when the last tick's user frames started arriving
    _stepped: float = -math.inf  # when the last step ended
    _called: bool = False  # a prefill call ran since the last step

    def user_frames(self, now: float) -> None:
        """User frames arrived at ``now``; a burst's first push (half a tick after the last) is the tick's."""
        if self._arrived is None or now - self._arrived >= self.tick_s / 2:
            self._arrived = now

    def stepped(self, now: float) -> None:
        self._stepped = now
        self._called = False

    def called(self, seconds: float) -> None:
        self.call_s = 0.7 * self.call_s + 0.3 * seconds
        self._called = True

    def may_call(self, now: float, live: bool) -> bool:
        if not live or self._arrived is None:
            return True
        if now < self._stepped + self.after_step_s:
            return False
        due = self._arrived + self.tick_s
        if now > due + self.tick_s / 2:
            return True  # the tick did not come: hold nothing on it
        if self._arrived > self._stepped:
            return False  # this tick's frames are here and its step has not run: the step goes first
        return not self._called or now + self.call_s <= due - self.before_tick_s

    def opens_in(self, now: float, live: bool) -> float:
        """Seconds until ``may_call`` turns true by time alone (new frames and steps change it too)."""
        if self.may_call(now, live):
            return 0.0
        assert self._arrived is not None  # may_call is true without a tick
        if now < self._stepped + self.after_step_s:
            return self._stepped + self.after_step_s - now
        return self._arrived + 1.5 * self.tick_s - now
