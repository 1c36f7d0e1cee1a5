"""A stop ends the gateway's background loops at once, even when one was woken in the same loop iteration.

On Python 3.11, ``asyncio.wait_for(event.wait(), t)`` returned instead of raising when the cancel of a stop
came in the iteration the event was set (a probe ended, a channel left READY), so the probe loop lived on
and the stop waited for it; a gateway test's teardown hung a minute now and then (gateway/tasks.py). These
wake the loops on purpose right before the cancel. The limits only bound a hang: a stop takes milliseconds.
"""

from __future__ import annotations

import asyncio

from gateway_kit import MakeStack

from gateway.tasks import cancel_and_wait, wait_event

HANG_LIMIT_S = 10.0


async def test_a_loop_woken_in_the_tick_of_its_cancel_ends() -> None:
    event = asyncio.Event()
    rounds = 0

    async def loop() -> None:
        nonlocal rounds
        while True:
            await wait_event(event, 5.0)
            event.clear()
            rounds += 1

    task = asyncio.create_task(loop())
    await asyncio.sleep(0)  # the loop waits on the event
    event.set()
    task.cancel()
    await asyncio.wait([task], timeout=HANG_LIMIT_S)
    assert task.cancelled() and rounds == 0


async def test_wait_event_reports_the_event_or_the_timeout() -> None:
    event = asyncio.Event()
    assert await wait_event(event, 0.01) is False
    asyncio.get_running_loop().call_soon(event.set)
    assert await wait_event(event, HANG_LIMIT_S) is True


async def test_cancel_and_wait_raises_what_a_task_died_of() -> None:
    async def broken() -> None:
        raise RuntimeError("probe bug")

    dead = asyncio.create_task(broken())
    await asyncio.sleep(0)
    try:
        await cancel_and_wait([dead, asyncio.create_task(asyncio.sleep(60))])
    except RuntimeError as err:
        assert str(err) == "probe bug"
    else:
        raise AssertionError("the task's error was lost")


async def test_a_stop_right_after_every_loop_was_woken_ends_them_all(make_stack: MakeStack) -> None:
    """The core's stop cancels its loops (both pools' probe loops, the readiness watch) first thing, in the
    same iteration as these wakes; the fixture's teardown then stops the whole gateway as usual."""
    stack = await make_stack()
    core = stack.gateway.core
    loops = list(core._tasks)
    assert len(loops) >= 3
    core.codecs._wake.set()
    core.talkers._wake.set()
    core._kick.set()
    stop = asyncio.create_task(core.stop())
    done, _ = await asyncio.wait([stop], timeout=HANG_LIMIT_S)
    if not done:  # cancel the loops once more, so the hung stop ends and the teardown can run
        for task in loops:
            task.cancel()
        await asyncio.wait([stop], timeout=HANG_LIMIT_S)
    assert done, "the stop waited for a loop that ignored its cancel"
    assert all(task.cancelled() for task in loops)
