"""What the talker's and the codec's workers share: the engine thread, its lifecycle, and the bridge from it
to the event loop (outputs to each stream's listener, engine exceptions to ``StageFailure``).

A tick that raises ends only the requests it was working on (the engine's ``recover`` names them and frees
their slots; their listeners hear ``on_request_failed``, INTERNAL); the stage serves on. A device failure,
or an engine without ``recover``, fails every listener and stops the stage (``on_engine_failed``).

A stage's worker subclasses ``StageWorker`` and adds its own commands (built on ``_call``) and says how an
output names its stream and reaches the listener. Like the engines it drives, this module imports no
``grpc``; it imports no torch either.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import ClassVar, Generic, Protocol, TypeVar

from voxstage.stage.engine_loop import EngineThread, Steppable
from voxstage.stage.errors import StageFailure
from voxstage.stage.faults import is_device_error, one_line

T = TypeVar("T")
O = TypeVar("O")


class EngineListener(Protocol):
    def on_engine_failed(self, message: str) -> None: ...

    def on_request_failed(self, message: str) -> None:
        """This request's part of a tick failed (not the device): end it with INTERNAL."""
        ...


L = TypeVar("L", bound=EngineListener)


class SessionListener(EngineListener, Protocol):
    def on_session_error(self, code: str, message: str) -> None: ...


SL = TypeVar("SL", bound=SessionListener)


def session_error(exc: Exception, role: str) -> tuple[str, str]:
    """(status name, message) that ends the one session whose command raised ``exc``; a device failure is
    re-raised, since it ends every session (voxstage.stage.faults)."""
    if is_device_error(exc):
        raise exc
    if isinstance(exc, ValueError | KeyError):
        code = "INVALID_ARGUMENT" if isinstance(exc, ValueError) else "FAILED_PRECONDITION"
        return code, str(exc.args[0] if exc.args else exc)
    return "INTERNAL", f"{role}: {one_line(exc)}"


class StageWorker(Generic[O, L]):
    """One engine thread and the listeners of the streams it serves (keyed by the engine's stream id)."""

    role: ClassVar[str]  # "talker" / "codec": in the thread's name and in failure messages
    # Engine exceptions the protocol reports as RESOURCE_EXHAUSTED / INVALID_ARGUMENT, checked in this
    # order before KeyError (FAILED_PRECONDITION) and RuntimeError (UNAVAILABLE).
    admission_errors: ClassVar[tuple[type[Exception], ...]] = ()
    invalid_errors: ClassVar[tuple[type[Exception], ...]] = (ValueError,)

    def __init__(self, steppable: Steppable[O]) -> None:
        name = f"{self.role}-engine"
        self._thread = EngineThread(
            steppable, self._sink, name=name, on_error=self._on_error, on_tick_error=self._tick_failed
        )
        self._listeners: dict[str, L] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._on_fatal: Callable[[str], None] | None = None
        self.failed: str | None = None

    # -- hooks -------------------------------------------------------------------------------------------
    def _route(self, output: O) -> tuple[str, bool]:
        """(stream key, whether this is the stream's last output) of one engine output."""
        raise NotImplementedError

    def _deliver(self, listener: L, output: O) -> None:
        raise NotImplementedError

    # -- lifecycle (event loop) -------------------------------------------------------------------------
    def start(self, loop: asyncio.AbstractEventLoop, on_fatal: Callable[[str], None] | None = None) -> None:
        self._loop = loop
        self._on_fatal = on_fatal
        self._thread.start()

    def stop(self) -> None:
        self._thread.stop()

    # -- engine thread -> event loop ----------------------------------------------------------------------
    async def _call(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` on the engine thread; its exceptions come back as the ``StageFailure`` the protocol
        assigns them (docs/protocol.md §7)."""
        return await self._result(self._submit(fn))

    def _submit(self, fn: Callable[[], T]) -> asyncio.Future[T]:
        """Hand ``fn`` to the engine thread now, in order with every command handed before it; ``_result``
        of the future is its value. For a caller with other work to start before that result (the codec
        opens the talker while its engine opens the stream)."""
        if self.failed is not None:
            raise StageFailure("INTERNAL", f"{self.role} engine failed: {self.failed}")
        return asyncio.wrap_future(self._thread.call(fn))

    async def _result(self, fut: asyncio.Future[T]) -> T:
        try:
            return await fut
        except StageFailure:
            raise
        except self.admission_errors as exc:
            raise StageFailure("RESOURCE_EXHAUSTED", str(exc)) from exc
        except self.invalid_errors as exc:
            raise StageFailure("INVALID_ARGUMENT", str(exc)) from exc
        except KeyError as exc:
            raise StageFailure("FAILED_PRECONDITION", str(exc.args[0] if exc.args else exc)) from exc
        except RuntimeError as exc:
            raise StageFailure("UNAVAILABLE", f"{self.role} engine: {exc}") from exc

    def _sink(self, outputs: list[O]) -> None:
        self._post(self._dispatch, outputs)

    def _post(self, fn: Callable[..., object], *args: object) -> None:
        """Engine thread: ``fn(*args)`` on the event loop. A loop already closed (a process stopping while a
        long tick was still running: ``stop`` waits a bounded time) has no listener left to tell, so the
        call is dropped instead of failing the tick, then every request, then the thread."""
        assert self._loop is not None
        try:
            self._loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:
            if not self._loop.is_closed():
                raise

    def _dispatch(self, outputs: list[O]) -> None:
        for out in outputs:
            key, last = self._route(out)
            listener = self._listeners.get(key)
            if last:
                self._listeners.pop(key, None)
            if listener is not None:
                self._deliver(listener, out)

    def _tick_failed(self, exc: Exception) -> None:
        # Engine thread: the engine sheds the failed requests now (``Steppable.recover``; one that cannot
        # re-raises and the stage stops); on the loop, the others get what the tick had made for them and the
        # failed ones' listeners hear why.
        keys, salvaged = self._thread.engine.recover(exc)
        message = f"{self.role}: this request failed inside the engine: {one_line(exc)}"
        if salvaged:
            self._sink(salvaged)
        self._post(self._fail_requests, keys, message)

    def _fail_requests(self, keys: list[str], message: str) -> None:
        for key in keys:
            listener = self._listeners.pop(key, None)
            if listener is not None:
                listener.on_request_failed(message)

    def _on_error(self, exc: BaseException) -> None:
        self._post(self._fail_all, one_line(exc))

    def _fail_all(self, message: str) -> None:
        self.failed = message
        listeners, self._listeners = self._listeners, {}
        for listener in listeners.values():
            listener.on_engine_failed(message)
        if self._on_fatal is not None:
            self._on_fatal(message)


class SessionWorker(StageWorker[O, SL]):
    """A worker whose streams are sessions (duplex): most commands are fire and forget, and one that fails
    ends its session and reports to that session's listener only, never to the engine (``session_error``:
    ValueError is INVALID_ARGUMENT, KeyError FAILED_PRECONDITION, anything else INTERNAL; a device failure
    is re-raised and stops the stage)."""

    def _end_session(self, key: str) -> None:
        """Engine thread: take the session out of the engine after a failed command."""
        raise NotImplementedError

    _pending: list[tuple[str, Callable[[], None]]] | None = None

    def _command(self, key: str, fn: Callable[[], None]) -> None:
        # Every session's commands of one turn of the event loop (a link batch's user audio or codes, a
        # tick's frames) reach the engine thread as one call, in order, not one hand-off per session.
        if self.failed is not None:
            return
        if self._pending is None:
            self._pending = []
            assert self._loop is not None
            self._loop.call_soon(self.flush_commands)
        self._pending.append((key, fn))

    def flush_commands(self) -> None:
        """Hand the queued commands to the engine thread now (before a direct call that must follow them)."""
        batch, self._pending = self._pending, None
        if batch and self.failed is None:
            self._thread.call(lambda: self._run_commands(batch))

    def _run_commands(self, batch: list[tuple[str, Callable[[], None]]]) -> None:
        for key, fn in batch:
            self._guard(key, fn)

    def _submit(self, fn: Callable[[], T]) -> asyncio.Future[T]:
        self.flush_commands()
        return super()._submit(fn)

    def _guard(self, key: str, fn: Callable[[], None]) -> None:
        try:
            fn()
        except Exception as exc:  # noqa: BLE001 - whatever one session's command raises is that session's
            code, message = session_error(exc, self.role)
            self._end_session(key)
            listener = self._listeners.get(key)
            if listener is not None and self._loop is not None:
                self._post(listener.on_session_error, code, message)
