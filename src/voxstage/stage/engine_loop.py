"""The one thread that owns a stage's model loop.

Async gRPC handlers never run model code (ARCHITECTURE.md §1). They post commands here; the engine thread
applies them between ticks, runs ``engine.step()`` while there is work, and hands each tick's outputs to a
sink (which, in a servicer, hops back onto the event loop with ``call_soon_threadsafe``). Commands run on the
engine thread, so engines need no locks of their own.

A failure belongs to its request (``voxstage.stage.faults``): a command's exception goes back to its caller;
a tick that raises is handed to ``on_tick_error``, which ends the requests that tick was working on and lets
the thread go on. Only a device failure (or a tick error nobody can recover from) ends the thread, with one
log line, and ``on_error`` then stops the stage for supervision to restart it.
"""

from __future__ import annotations

import concurrent.futures
import ctypes
import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any, Generic, Protocol, TypeVar

from voxstage.stage import torch_profile
from voxstage.stage.faults import DeviceStalled, is_device_error, one_line

log = logging.getLogger(__name__)

T = TypeVar("T")
O = TypeVar("O")


class Steppable(Protocol[O]):
    def has_work(self) -> bool: ...

    def step(self) -> list[O]: ...

    def idle_timeout(self) -> float | None:
        """Seconds until the engine has work of its own while idle (a duplex step's gather window); None:
        only a command wakes it."""
        return None

    def recover(self, exc: Exception) -> tuple[list[str], list[O]]:
        """After a tick raised ``exc`` (not a device failure): shed the requests that tick worked on and
        return (their stream keys, the outputs the tick had made for the others). The default cannot: the
        exception goes on and stops the stage."""
        raise exc


def log_capture(
    logger: logging.Logger, role: str, capture: Callable[[], int], what: str = "CUDA graphs"
) -> None:
    """Run a warm-up's graph capture (engine thread) and say how many graphs it took how long to capture,
    and how much device memory the capture reserved (the graphs' pool is outside the stage's budget)."""
    t0 = time.perf_counter()
    before = _reserved_bytes()
    n = capture()
    if n:
        grew = (_reserved_bytes() - before) / 2**30
        logger.info(
            "%s: captured %d %s in %.1f s, %.2f GiB reserved", role, n, what, time.perf_counter() - t0, grew
        )


def _reserved_bytes() -> int:
    import torch  # stage processes only; the module itself stays importable without it

    return torch.cuda.memory_reserved() if torch.cuda.is_available() and torch.cuda.is_initialized() else 0


IDLE_POLL_S = 0.05  # how long an idle engine sleeps on its command queue before looking again
# A tick still running after this long is a stuck device (ticks take milliseconds; a graph captured on first
# use, well under a second): a tick that waits on the device then never returns, and without the watchdog
# the stage would serve silence with no word.
STALL_S = 60.0


def run_until_idle(engine: Steppable[O], sink: Callable[[list[O]], None] | None = None) -> None:
    """Step ``engine`` on the calling thread until it has nothing left, sleeping its ``idle_timeout`` where
    it waits for time rather than input (a paced talker: ``has_work()`` is false until its next step is
    due), as ``EngineThread`` would: a warm-up's request, run to its end."""
    while True:
        if engine.has_work():
            outputs = engine.step()
            if sink is not None and outputs:
                sink(outputs)
            continue
        wait = engine.idle_timeout()
        if wait is None:
            return
        time.sleep(wait)


def name_os_thread(name: str) -> None:
    """The calling thread's name as the OS shows it (``top -H``, ``/proc/PID/task/TID/comm``, at most 15
    bytes): Python's thread names stay inside Python, so an engine thread's CPU could not be told from the
    event loop's helpers. Best effort: where ``prctl`` is missing the name stays the process's."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(15, name.encode()[:15], 0, 0, 0)  # PR_SET_NAME
    except (OSError, AttributeError):
        pass


class EngineThread(Generic[O]):
    def __init__(
        self,
        engine: Steppable[O],
        sink: Callable[[list[O]], None],
        *,
        name: str,
        on_error: Callable[[BaseException], None] | None = None,
        on_tick_error: Callable[[Exception], None] | None = None,
        stall_s: float = STALL_S,
    ) -> None:
        self.engine = engine
        self._sink = sink
        self._on_error = on_error
        # Runs on this thread after a tick raised: ends the requests it held (raises if it cannot).
        self._on_tick_error = on_tick_error
        self._commands: queue.SimpleQueue[tuple[Callable[[], Any], concurrent.futures.Future[Any]] | None] = (
            queue.SimpleQueue()
        )
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._stall_s = stall_s
        self._tick_since: float | None = None  # when the tick under way began (monotonic s); None between
        self._watchdog = threading.Thread(target=self._watch, name=f"{name}-watchdog", daemon=True)

    def start(self) -> None:
        self._thread.start()
        self._watchdog.start()

    def call(self, fn: Callable[[], T]) -> concurrent.futures.Future[T]:
        """Run ``fn`` on the engine thread before its next tick; the future carries its result or error."""
        fut: concurrent.futures.Future[T] = concurrent.futures.Future()
        if self._stopping.is_set():
            fut.set_exception(RuntimeError("engine is stopped"))
            return fut
        self._commands.put((fn, fut))
        return fut

    def stop(self, timeout: float = 10.0) -> None:
        self._stopping.set()
        self._commands.put(None)
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def _idle_wait(self) -> float:
        """An engine with a deadline of its own (``idle_timeout()``: a duplex step's gather window) is woken
        by it; otherwise an idle engine sleeps on its command queue."""
        wait = self.engine.idle_timeout()
        return IDLE_POLL_S if wait is None else min(wait, IDLE_POLL_S)

    def _drain(self, block: bool) -> None:
        try:
            item = self._commands.get(timeout=self._idle_wait()) if block else self._commands.get_nowait()
        except queue.Empty:
            return
        while True:
            if item is None:
                return
            fn, fut = item
            if fut.set_running_or_notify_cancel():
                try:
                    fut.set_result(fn())
                except BaseException as exc:  # noqa: BLE001 - the caller's future carries it
                    fut.set_exception(exc)
                    if is_device_error(exc):
                        raise  # the device is gone for every request, not just this command's
            try:
                item = self._commands.get_nowait()
            except queue.Empty:
                return

    def _run(self) -> None:
        profile = torch_profile.CAPTURE  # None unless VOXSTAGE_TORCH_PROFILE armed this process
        name = self._thread.name
        name_os_thread(name)
        while not self._stopping.is_set():
            try:
                busy = self.engine.has_work()
                # Idle: sleep on the command queue (no busy polling); busy: just pick up what arrived.
                self._drain(block=not busy)
                if profile is not None:
                    profile.poll()
                if self.engine.has_work():
                    self._tick_since = time.monotonic()
                    try:
                        with profile.tick(name) if profile is not None else torch_profile.NO_SCOPE:
                            outputs = self.engine.step()
                    finally:
                        self._tick_since = None
                    if outputs:
                        self._sink(outputs)
            except BaseException as exc:  # noqa: BLE001 - a dead engine thread must be reported, not silent
                if self._recovered(exc):
                    continue
                if is_device_error(exc):
                    log.error("engine thread %s: device failure, the stage stops: %s", self._thread.name,
                              one_line(exc))  # fmt: skip
                else:
                    log.exception("engine thread %s failed", self._thread.name)
                if self._on_error is not None:
                    self._on_error(exc)
                self._stopping.set()
        # Fail whatever is still queued so no caller waits forever.
        while True:
            try:
                item = self._commands.get_nowait()
            except queue.Empty:
                break
            if item is not None and not item[1].done():
                item[1].set_exception(RuntimeError("engine stopped"))

    def _watch(self) -> None:
        """Stop the stage (``on_error``, as for a device failure) when a tick outlives ``stall_s``: the
        engine thread itself cannot, it is inside the call that does not return."""
        while not self._stopping.wait(min(1.0, self._stall_s / 4)):
            since = self._tick_since
            if since is None or time.monotonic() - since <= self._stall_s:
                continue
            exc = DeviceStalled(f"a tick has run {time.monotonic() - since:.0f} s: the device is stuck")
            log.error("engine thread %s: device failure, the stage stops: %s", self._thread.name,
                      one_line(exc))  # fmt: skip
            if self._on_error is not None:
                self._on_error(exc)
            self._stopping.set()
            return

    def _recovered(self, exc: BaseException) -> bool:
        """A tick's non-device failure: its requests end (``on_tick_error``) and the thread goes on."""
        if self._on_tick_error is None or not isinstance(exc, Exception) or is_device_error(exc):
            return False
        log.exception("engine thread %s: a tick failed; ending the requests it held", self._thread.name)
        try:
            self._on_tick_error(exc)
        except BaseException:  # noqa: BLE001 - an engine that cannot shed the requests must stop
            log.exception("engine thread %s: could not end the failed tick's requests", self._thread.name)
            return False
        return True
