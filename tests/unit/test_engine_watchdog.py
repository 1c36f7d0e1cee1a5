"""The engine thread's watchdog (voxstage.stage.engine_loop): a tick that does not return within ``stall_s``
(a wait on a stuck device) stops the stage as a device failure, once; ticks that return, however many, never
do. The steppable here stands in for an engine whose tick waits on the device; the stage's real engines run
on this same thread class in tests/unit/talker/test_talker_request_failures.py."""

from __future__ import annotations

import threading
import time

from voxstage.stage.engine_loop import EngineThread
from voxstage.stage.faults import DeviceStalled, is_device_error


class Engine:
    def __init__(self, ticks_before_stuck: int | None) -> None:
        self.left = ticks_before_stuck
        self.device = threading.Event()  # set: the stuck wait returns
        self.ticks = 0

    def has_work(self) -> bool:
        return True

    def idle_timeout(self) -> float | None:
        return None

    def step(self) -> list[int]:
        self.ticks += 1
        if self.left is not None:
            self.left -= 1
            if self.left < 0:
                self.device.wait(30)  # the device never answers
        else:
            time.sleep(0.001)
        return []


def run(engine: Engine, seconds: float, stall_s: float) -> list[BaseException]:
    failed: list[BaseException] = []
    thread = EngineThread(engine, lambda out: None, name="t", on_error=failed.append, stall_s=stall_s)
    thread.start()
    try:
        end = time.monotonic() + seconds
        while time.monotonic() < end and not failed:
            time.sleep(0.02)
        time.sleep(0.5)  # a second report would come within this
    finally:
        engine.device.set()
        thread.stop()
    return failed


def test_a_tick_that_never_returns_stops_the_stage_as_a_device_failure() -> None:
    engine = Engine(ticks_before_stuck=5)
    failed = run(engine, seconds=5, stall_s=0.3)
    assert len(failed) == 1 and isinstance(failed[0], DeviceStalled) and is_device_error(failed[0])
    assert "the device is stuck" in str(failed[0]) and engine.ticks == 6


def test_ticks_that_return_never_trip_it() -> None:
    engine = Engine(ticks_before_stuck=None)
    assert run(engine, seconds=2.0, stall_s=1.0) == [] and engine.ticks > 100  # each a few ms
