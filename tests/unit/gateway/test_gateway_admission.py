"""Admission control on its own: the limit, the bounded FIFO queue, timeouts, hand-over and draining."""

from __future__ import annotations

import asyncio
import contextlib

import grpc
import pytest

from gateway.admission import Admission
from gateway.errors import GatewayError
from voxstage import metrics


def gauge(name: str) -> float:
    value = metrics.REGISTRY.get_sample_value(name, {"stage": "gateway"})
    assert value is not None
    return value


async def test_limit_then_queue_then_refusal_with_retry_hint() -> None:
    adm = Admission(2, max_queue=1, queue_timeout_s=5.0)
    await adm.acquire()
    await adm.acquire()
    assert gauge("voxstage_active_streams") == 2
    queued = asyncio.ensure_future(adm.acquire())
    await asyncio.sleep(0)
    assert adm.queued == 1 and gauge("voxstage_queue_depth") == 1
    with pytest.raises(GatewayError) as err:
        await adm.acquire()
    assert err.value.code is grpc.StatusCode.RESOURCE_EXHAUSTED and err.value.field == "admission"
    assert err.value.retry_after_s is not None and err.value.retry_after_s > 0
    assert "gateway.max_queue 1" in err.value.text
    adm.release(held_s=1.0)  # hands the slot to the queued request, never dipping below the limit
    await queued
    assert adm.active == 2 and adm.queued == 0 and gauge("voxstage_queue_depth") == 0


async def test_fifo_order_and_queue_timeout() -> None:
    adm = Admission(1, max_queue=5, queue_timeout_s=0.2)
    await adm.acquire()
    order: list[int] = []

    async def waiter(i: int) -> None:
        await adm.acquire()
        order.append(i)

    tasks = [asyncio.ensure_future(waiter(i)) for i in range(3)]
    await asyncio.sleep(0.01)
    for _ in range(3):
        adm.release(held_s=None)
        await asyncio.sleep(0.01)
    await asyncio.gather(*tasks)
    assert order == [0, 1, 2]
    with pytest.raises(GatewayError) as err:
        await adm.acquire()  # the last waiter still holds the only slot
    assert "gateway.queue_timeout_s" in err.value.text
    assert adm.queued == 0


async def test_cancelled_waiter_frees_its_place_and_a_handed_slot() -> None:
    adm = Admission(1, max_queue=2, queue_timeout_s=5.0)
    await adm.acquire()
    gone = asyncio.ensure_future(adm.acquire())
    stays = asyncio.ensure_future(adm.acquire())
    await asyncio.sleep(0)
    gone.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await gone
    assert adm.queued == 1
    adm.release(held_s=None)
    await stays
    assert adm.active == 1
    adm.release(held_s=None)
    assert adm.active == 0


async def test_draining_refuses_with_unavailable() -> None:
    adm = Admission(1, max_queue=0, queue_timeout_s=1.0)
    adm.draining = True
    with pytest.raises(GatewayError) as err:
        await adm.acquire()
    assert err.value.code is grpc.StatusCode.UNAVAILABLE and "draining" in err.value.text


async def test_slot_context_releases_on_error() -> None:
    adm = Admission(1, max_queue=0, queue_timeout_s=1.0)
    with pytest.raises(RuntimeError):
        async with adm.slot():
            raise RuntimeError("request failed")
    assert adm.active == 0
    async with adm.slot():
        assert adm.active == 1
