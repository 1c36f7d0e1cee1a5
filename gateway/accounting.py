"""Per-request latency and smoothness accounting at the gateway, published to the contract metrics.

* time to first audio: request arrival (for streamed text: the first text delta, since a client that
  opens a stream and types later is not waiting on us) to the first audio byte written to the client;
* request duration: arrival to the last byte;
* real-time factor: generation wall time (first work to last audio) over the audio duration produced;
* for a whole clip (unary ``Synthesize``, non-streamed HTTP) the first byte leaves with the last, so TTFA
  is observed when the clip is handed to the transport, and the underrun is zero by construction;
* underrun: a player with no prebuffer starts at the first chunk and plays in real time; every time the
  next chunk arrives after the player ran dry, it stalls for the gap. Each flushed segment restarts the
  player, because the silence between segments is the client's text cadence, not a server stall.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from dataclasses import dataclass, field

from gateway.errors import GatewayError
from voxstage import metrics

# One line per request (logger ``voxstage.gateway.access``): what an operator greps for a request id.
access_log = logging.getLogger("voxstage.gateway.access")
# A call cancelled this close to its deadline (or later) was ended by the deadline: gRPC cancels the handler
# when the deadline passes, so the cancellation arrives a little after it.
DEADLINE_SLACK_S = 0.05
_CODES = {"ok": "OK", "cancelled": "CANCELLED", "deadline_exceeded": "DEADLINE_EXCEEDED"}


@dataclass
class PlaybackSimulator:
    play_until: float | None = None
    underrun_s: float = 0.0

    def on_chunk(self, now: float, seconds: float, *, restart: bool = False) -> None:
        if self.play_until is None or restart:
            self.play_until = now + seconds
            return
        if now > self.play_until:
            self.underrun_s += now - self.play_until
            self.play_until = now
        self.play_until += seconds


@dataclass
class RequestAccounting:
    api: str
    whole_clip: bool = False
    arrival: float = field(default_factory=time.monotonic)
    work_started: float | None = None
    first_audio: float | None = None
    last_audio: float | None = None
    audio_s: float = 0.0
    player: PlaybackSimulator = field(default_factory=PlaybackSimulator)
    request_id: str = "-"  # known once the request is checked; a request refused before that has none
    voice: str = "-"
    model: str = "-"
    # The client's deadline (monotonic), where one applies: gRPC's, or gateway.max_stream_lifetime_s on HTTP.
    deadline: float | None = None
    _done: bool = False
    _outcome: str = ""
    _code: str = ""

    def describe(self, request_id: str, voice: str, model: str) -> None:
        self.request_id, self.voice, self.model = request_id, voice or "-", model or "-"

    def start_work(self, now: float | None = None) -> None:
        if self.work_started is None:
            self.work_started = time.monotonic() if now is None else now

    @property
    def ttfa_s(self) -> float | None:
        if self.first_audio is None:
            return None
        return self.first_audio - (self.work_started if self.work_started is not None else self.arrival)

    def on_audio_sent(self, seconds: float, *, segment_start: bool = False, now: float | None = None) -> None:
        """A chunk holding ``seconds`` of audio was written to the client."""
        t = time.monotonic() if now is None else now
        self.last_audio = t
        self.audio_s += seconds
        if self.whole_clip:
            return
        if self.first_audio is None:
            self._first_byte(t)
        self.player.on_chunk(t, seconds, restart=segment_start)

    def clip_sent(self, now: float | None = None) -> None:
        """The whole clip was handed to the transport (whole-clip responses only)."""
        if self.first_audio is None and self.audio_s > 0:
            self._first_byte(time.monotonic() if now is None else now)
            if self._done:  # synthesis ended before the clip was encoded and sent: the line waited for it
                self._log(self._outcome, self.first_audio)

    def _log(self, outcome: str, end: float) -> None:
        ttfa = "-" if self.ttfa_s is None else f"{1e3 * self.ttfa_s:.1f}"
        access_log.info(
            "request id=%s api=%s model=%s voice=%s outcome=%s ttfa_ms=%s duration_ms=%.1f audio_s=%.2f "
            "code=%s",
            self.request_id, self.api, self.model, self.voice, outcome, ttfa, 1e3 * (end - self.arrival),
            self.audio_s, self._code,
        )  # fmt: skip

    def _first_byte(self, t: float) -> None:
        self.first_audio = t
        metrics.TIME_TO_FIRST_AUDIO.labels(api=self.api).observe(self.ttfa_s or 0.0)

    def finish(self, outcome: str, now: float | None = None, *, code: str = "") -> None:
        """The request ended with ``outcome`` (a ``voxstage_requests_total`` label) and status ``code`` (a
        gRPC status name; by default the error being raised, if any, else one implied by the outcome)."""
        if self._done:
            return
        self._done = True
        t = time.monotonic() if now is None else now
        if outcome == "cancelled" and self.deadline is not None and t >= self.deadline - DEADLINE_SLACK_S:
            outcome = "deadline_exceeded"
        self._outcome = outcome
        self._code = code or _code_of(outcome)
        metrics.REQUESTS.labels(outcome=outcome).inc()
        metrics.REQUEST_DURATION.labels(api=self.api).observe(t - self.arrival)
        if outcome != "ok" or not (self.whole_clip and self.audio_s > 0 and self.first_audio is None):
            # A failed whole clip is never sent, so its line cannot wait for clip_sent.
            self._log(outcome, t)  # else clip_sent logs it, with the clip's time to first audio
        if self.last_audio is None or self.audio_s <= 0:
            return
        start = self.work_started if self.work_started is not None else self.arrival
        metrics.REAL_TIME_FACTOR.observe((self.last_audio - start) / self.audio_s)
        metrics.AUDIO_UNDERRUN.observe(self.player.underrun_s)
        metrics.AUDIO_GENERATED.labels(stage="gateway").inc(self.audio_s)


def _code_of(outcome: str) -> str:
    if outcome in ("cancelled", "deadline_exceeded"):
        return _CODES[outcome]
    # finish() is called from the synthesis run's ``finally``, where the error on its way out is the only
    # record of its exact status (outcome "invalid" covers INVALID_ARGUMENT, NOT_FOUND, ...).
    exc = sys.exc_info()[1]
    if isinstance(exc, GatewayError):
        return exc.code.name
    if isinstance(exc, asyncio.CancelledError | GeneratorExit):
        return "CANCELLED"
    return _CODES.get(outcome, "UNKNOWN" if exc is None else "INTERNAL")
