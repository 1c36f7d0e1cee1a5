"""The two clocks of one ``StreamingSynthesize`` call: an idle timeout and a lifetime limit.

A streaming call holds an admission slot and a codec stream (and the talker slot behind it) until it ends.
A client that sends its config and then nothing, never half-closing, or that stops reading its audio, would
hold them forever, and ``max_concurrent_requests`` such calls refuse everyone else. ``StreamWatch`` ends
such a call with DEADLINE_EXCEEDED and a message naming the setting, cancels its codec stream and frees
its slot:

- **idle** (``gateway.stream_idle_timeout_s``): the client sent nothing (text, flush, half-close) for that
  long while the server owed it no audio, or a response write has waited that long for the client to take
  it. While a flushed segment is being made the clock stands still: the codec's first-chunk and stall
  timeouts bound that wait, and a stream that is speaking is not idle.
- **lifetime** (``gateway.max_stream_lifetime_s``): from the call's start, whatever it does.

How the call is ended depends on where its handler waits. Inside the run (for the codec's next message),
the watch fails the codec stream (``CodecStream.fail``), so the error leaves the run like any stage error
and the run's own cleanup cancels the stream and frees the slot. Parked at its ``yield`` while gRPC writes a
response the client does not read, the handler cannot run until that write completes, perhaps never; the
run generator is then suspended, not running, so the watch throws the error into it (``athrow``), which
runs the same cleanup at once. The handler ends the call with the error when its write completes; a client
that never reads again leaves the call to its own deadline or disconnect, holding nothing of the stages.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncGenerator, AsyncIterable, AsyncIterator
from typing import Any

import grpc

from gateway.errors import GatewayError
from gateway.tasks import wait_event
from gateway.tts.synthesis import Flush, InputItem
from gateway.upstream import CodecStream

IDLE_SETTING = "gateway.stream_idle_timeout_s"
LIFETIME_SETTING = "gateway.max_stream_lifetime_s"


class StreamWatch:
    def __init__(self, idle_s: float, lifetime_s: float) -> None:
        self.idle_s = idle_s
        self.lifetime_s = lifetime_s
        self.started = self.last_activity = time.monotonic()
        self.error: GatewayError | None = None
        self._stream: CodecStream | None = None
        self._owed = 0  # flushed segments the codec has not finished
        self._pending = False  # non-blank text since the last flush (as Synthesizer._pump counts it)
        self._input_ended = False
        self._writing = False
        self._running_since: float | None = None  # when the idle clock last started running; None: stopped
        self._teardown: asyncio.Task[None] | None = None
        self._changed = asyncio.Event()  # the idle clock started: the guard recomputes its wake-up

    @property
    def expires_at(self) -> float:
        """When the lifetime limit ends the call (monotonic); also the run's deadline, so that the admission
        wait and the codec call are bounded by it too."""
        return self.started + self.lifetime_s

    # -- what the run and the client do -----------------------------------------------------------------

    def attach(self, stream: CodecStream) -> None:
        """The run opened its codec stream. The idle clock starts now: admission and opening are bounded by
        ``queue_timeout_s`` and the first-chunk timeout. A call that expired meanwhile fails at once."""
        self._stream = stream
        self._update()
        if self.error is not None:
            stream.fail(self.error)

    def segment_done(self) -> None:
        self._owed = max(self._owed - 1, 0)
        self._update()

    async def inputs(self, items: AsyncIterable[InputItem]) -> AsyncIterator[InputItem]:
        """The client's input, passed through; every message and the half-close count as activity."""
        async for item in items:
            if isinstance(item, Flush):
                if self._pending:  # an empty flush asks the codec for nothing, so nothing is owed
                    self._pending = False
                    self._owed += 1
            elif item.strip():
                self._pending = True
            self._update()
            yield item
        self._input_ended = True  # the rest is owed by the server: the codec's timeouts bound it
        self._update()

    def writing(self) -> None:
        """The handler is about to ``yield`` a response; gRPC writes it while the handler is parked."""
        self._writing = True
        self._update(activity=False)

    async def written(self) -> bool:
        """The write completed. False when the watch tore the run down meanwhile: the call must end."""
        self._writing = False
        if self._teardown is not None:
            await asyncio.shield(self._teardown)
            return False
        self._update()
        return True

    def _update(self, *, activity: bool = True) -> None:
        """Note a change. The idle clock runs while the client owes the next move: no audio is owed to it
        (or it is not taking what is), and the stream is open. It counts from the later of the last activity
        and the moment it started running, so time the server spent making audio never counts."""
        now = time.monotonic()
        if activity:
            self.last_activity = now
        owed = self._input_ended or self._owed > 0
        running = self._stream is not None and (self._writing or not owed)
        if not running:
            self._running_since = None
        elif self._running_since is None:
            self._running_since = now
            self._changed.set()  # the guard may be sleeping on the lifetime alone

    # -- the clocks -------------------------------------------------------------------------------------

    def _idle_since(self) -> float | None:
        """When the idle clock started, or None while it stands still."""
        if self._running_since is None:
            return None
        return max(self._running_since, self.last_activity)

    def check(self, now: float) -> GatewayError | None:
        """The error that ends the call at ``now``, or None while both clocks have time left."""
        if now >= self.expires_at:
            return GatewayError(
                grpc.StatusCode.DEADLINE_EXCEEDED,
                f"the stream reached its time limit of {self.lifetime_s:g} s ({LIFETIME_SETTING})",
                reason="stream_expired",
            )
        since = self._idle_since()
        if since is not None and now >= since + self.idle_s:
            what = (
                "the client took no audio"
                if self._writing
                else "no text, flush or end of input from the client while no audio was owed"
            )
            return GatewayError(
                grpc.StatusCode.DEADLINE_EXCEEDED,
                f"{what} for {self.idle_s:g} s ({IDLE_SETTING})",
                reason="stream_idle_timeout",
            )
        return None

    async def guard(self, run: AsyncGenerator[Any, None]) -> None:
        """Sleep until a clock may run out, recheck, and end the call when one has."""
        while True:
            now = time.monotonic()
            err = self.check(now)
            if err is not None:
                break
            due = self.expires_at
            since = self._idle_since()
            if since is not None:
                due = min(due, since + self.idle_s)
            self._changed.clear()
            await wait_event(self._changed, max(due - now, 0.0))
        self.error = err
        if self._writing:
            self._teardown = asyncio.create_task(self._throw(run, err))
        elif self._stream is not None:
            self._stream.fail(err)
        # Else the run is still being admitted or opened: ``attach`` fails the stream when it opens.

    @staticmethod
    async def _throw(run: AsyncGenerator[Any, None], err: GatewayError) -> None:
        with contextlib.suppress(Exception):  # the run accounts for the error and raises it back: expected
            await run.athrow(err)

    async def close(self, run: AsyncGenerator[Any, None], *, finished: bool) -> None:
        """End the run for the handler: after the watch's own teardown, or by throwing the watch's error in
        (so the request is accounted as timed out, not cancelled), or by closing it."""
        if self._teardown is not None:
            await asyncio.shield(self._teardown)
        elif self.error is not None and not finished:
            await self._throw(run, self.error)
        else:
            await run.aclose()
