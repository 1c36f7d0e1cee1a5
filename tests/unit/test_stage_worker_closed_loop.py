"""A stage worker whose event loop closed while a long tick ran (a stopping process: ``stop`` waits a bounded
time for the engine thread): the tick's outputs are dropped, not turned into a failed tick, failed requests
and a thread that dies raising. The engine here is a double (one slow tick); the real engines' ticks are
tested in tests/unit/talker and tests/unit/codec."""

from __future__ import annotations

import asyncio
import logging
import threading

import pytest

from voxstage.stage.worker import StageWorker


class SlowEngine:
    """One tick that waits for ``release`` and then outputs one item; nothing to do after it."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.stepping = threading.Event()
        self.done = threading.Event()
        self.recovered: list[Exception] = []

    def has_work(self) -> bool:
        return not self.done.is_set()

    def idle_timeout(self) -> float | None:
        return None

    def step(self) -> list[str]:
        self.stepping.set()
        self.release.wait(5)
        self.done.set()
        return ["s1:last"]

    def recover(self, exc: Exception) -> tuple[list[str], list[str]]:
        self.recovered.append(exc)
        return ["s1"], []


class Listener:
    def __init__(self) -> None:
        self.heard: list[str] = []

    def on_engine_failed(self, message: str) -> None:
        self.heard.append(message)

    def on_request_failed(self, message: str) -> None:
        self.heard.append(message)


class Worker(StageWorker[str, Listener]):
    role = "test"

    def _route(self, output: str) -> tuple[str, bool]:
        key, _, tail = output.partition(":")
        return key, tail == "last"

    def _deliver(self, listener: Listener, output: str) -> None:
        listener.heard.append(output)


def test_a_tick_ending_after_the_loop_closed_is_dropped_quietly(caplog: pytest.LogCaptureFixture) -> None:
    engine = SlowEngine()
    worker = Worker(engine)  # type: ignore[arg-type]  # the double stands in for a Steppable
    listener = Listener()
    worker._listeners["s1"] = listener  # noqa: SLF001 - a stream opened before the stop
    loop = asyncio.new_event_loop()
    worker.start(loop)
    assert engine.stepping.wait(5)
    loop.close()  # the process's loop is gone while the tick still runs
    with caplog.at_level(logging.ERROR):
        engine.release.set()
        worker.stop()
    assert not worker._thread.alive  # noqa: SLF001 - the thread ended by its stop, not by an exception
    assert engine.recovered == [] and worker.failed is None
    assert listener.heard == []  # nobody is left to hear it: nothing ran on the closed loop
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text


def test_outputs_still_reach_a_running_loop() -> None:
    engine = SlowEngine()
    worker = Worker(engine)  # type: ignore[arg-type]
    listener = Listener()

    async def main() -> None:
        worker._listeners["s1"] = listener  # noqa: SLF001
        worker.start(asyncio.get_running_loop())
        engine.release.set()
        for _ in range(200):
            if listener.heard:
                break
            await asyncio.sleep(0.01)

    asyncio.run(main())
    worker.stop()
    assert listener.heard == ["s1:last"]
