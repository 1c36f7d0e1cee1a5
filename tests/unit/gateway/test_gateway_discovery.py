"""Discovery (issue 17): a stage address that is a name stands for every endpoint it resolves to.

The pools here probe nothing real: their status function answers for each replica from a table, and the
resolver is a dictionary the test edits, so each test drives membership changes directly through the
same code the gateway runs (``Discovery.resolve_now`` / ``Discovery.run``).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import grpc
import pytest

from gateway.discovery import Discovery, Target
from gateway.errors import GatewayError
from gateway.routing import Replica, ReplicaPool
from tests.fake_resolver import FakeResolver
from voxstage.internal.v1 import stage_pb2
from voxstage.resolver import ResolveError, SystemResolver


async def ready(replica: Replica) -> stage_pb2.StageStatus:
    return stage_pb2.StageStatus(ready=True, active_streams=0)


def members(pool: ReplicaPool) -> dict[str, bool]:
    """address -> draining"""
    return {r.address: r.draining for r in pool.replicas}


async def until(condition: Callable[[], bool], limit_s: float = 3.0) -> float:
    start = time.monotonic()
    while not condition():
        assert time.monotonic() - start < limit_s, "condition not reached in time"
        await asyncio.sleep(0.01)
    return time.monotonic() - start


@contextlib.asynccontextmanager
async def running(discovery: Discovery) -> AsyncIterator[None]:
    task = asyncio.create_task(discovery.run())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def test_targets_tell_names_from_ip_literals() -> None:
    assert Target.parse("10.0.0.1:50061").static and Target.parse("[::1]:7").static
    name = Target.parse("talker.ns.svc.cluster.local:50051")
    assert not name.static and (name.host, name.port) == ("talker.ns.svc.cluster.local", 50051)


async def test_ip_literals_are_never_resolved() -> None:
    resolver = FakeResolver({})
    pool = ReplicaPool("talker", ["10.0.0.1:1", "10.0.0.2:1"], ready, static_only=True)
    discovery = Discovery(pool, ["10.0.0.1:1", "10.0.0.2:1"], resolver, interval_s=0.05)
    assert not discovery.active
    await discovery.resolve_now()
    assert members(pool) == {"10.0.0.1:1": False, "10.0.0.2:1": False} and resolver.asked == []
    await pool.close()


async def test_a_name_becomes_its_endpoints_then_adds_and_drains() -> None:
    resolver = FakeResolver({"talker.ns": ["10.0.0.1", "10.0.0.2"]})
    addresses = ["talker.ns:50061", "10.9.9.9:7"]  # a name next to a static entry
    pool = ReplicaPool("talker", addresses, ready, static_only=True)
    discovery = Discovery(pool, addresses, resolver, interval_s=60)
    assert list(members(pool)) == ["10.9.9.9:7"]  # the name waits for its first resolution
    await discovery.resolve_now()
    assert members(pool) == {"10.9.9.9:7": False, "10.0.0.1:50061": False, "10.0.0.2:50061": False}
    assert {r.source for r in pool.replicas} == {"talker.ns:50061", "10.9.9.9:7"}
    await pool.probe_all(force=True)

    # A scale-up adds the new endpoint; a scale-down drains the one that left, with a stream still on it.
    leaving = pool.find("10.0.0.1:50061")
    assert leaving is not None
    leaving.in_flight = 1
    resolver.table["talker.ns"] = ["10.0.0.2", "10.0.0.3"]
    await discovery.resolve_now()
    assert members(pool) == {
        "10.9.9.9:7": False,
        "10.0.0.1:50061": True,
        "10.0.0.2:50061": False,
        "10.0.0.3:50061": False,
    }
    assert all(pool.pick() is not leaving for _ in range(12))  # no new work for a draining replica
    assert not pool.find("10.0.0.3:50061").down  # type: ignore[union-attr] - unprobed is tried, not refused

    leaving.in_flight = 0  # its last stream ended (callers give in_flight back directly)
    pool.reap_drained()
    assert "10.0.0.1:50061" not in members(pool)
    await pool.close()


async def test_a_draining_replica_that_returns_is_routable_again() -> None:
    resolver = FakeResolver({"codec.ns": ["10.0.0.1", "10.0.0.2"]})
    pool = ReplicaPool("codec", ["codec.ns:1"], ready, static_only=True)
    discovery = Discovery(pool, ["codec.ns:1"], resolver, interval_s=60)
    await discovery.resolve_now()
    first = pool.find("10.0.0.1:1")
    assert first is not None
    first.in_flight = 1
    resolver.table["codec.ns"] = ["10.0.0.2"]
    await discovery.resolve_now()
    assert first.draining
    resolver.table["codec.ns"] = ["10.0.0.1", "10.0.0.2"]
    await discovery.resolve_now()
    assert pool.find("10.0.0.1:1") is first and not first.draining  # the same replica, its stream intact
    await pool.close()


async def test_a_failed_lookup_keeps_the_last_answer_and_is_reported() -> None:
    resolver = FakeResolver({"talker.ns": ["10.0.0.1"]})
    pool = ReplicaPool("talker", ["talker.ns:1"], ready, static_only=True)
    discovery = Discovery(pool, ["talker.ns:1"], resolver, interval_s=60)
    await discovery.resolve_now()
    del resolver.table["talker.ns"]
    await discovery.resolve_now()
    assert members(pool) == {"10.0.0.1:1": False}
    pool.mark_down(pool.replicas[0], "test: refused")
    with pytest.raises(GatewayError) as err:
        pool.pick()
    assert err.value.code is grpc.StatusCode.UNAVAILABLE
    assert "talker.ns:1: does not resolve: talker.ns: NXDOMAIN" in err.value.text
    await pool.close()


async def test_periodic_re_resolution_picks_up_a_new_replica() -> None:
    resolver = FakeResolver({"talker.ns": ["10.0.0.1"]})
    pool = ReplicaPool("talker", ["talker.ns:1"], ready, static_only=True)
    discovery = Discovery(pool, ["talker.ns:1"], resolver, interval_s=0.2)
    await discovery.resolve_now()
    await pool.probe_all(force=True)
    async with running(discovery):
        resolver.table["talker.ns"] = ["10.0.0.1", "10.0.0.2"]
        took = await until(lambda: "10.0.0.2:1" in members(pool))
    assert took < 1.0 and discovery.lookups >= 2
    await pool.close()


async def test_a_replica_marked_down_re_resolves_at_once() -> None:
    resolver = FakeResolver({"talker.ns": ["10.0.0.1"]})
    pool = ReplicaPool("talker", ["talker.ns:1"], ready, static_only=True)
    discovery = Discovery(pool, ["talker.ns:1"], resolver, interval_s=3600)  # only a failure can trigger it
    await discovery.resolve_now()
    async with running(discovery):
        await asyncio.sleep(0.6)  # past the minimum gap between two lookups
        before = discovery.lookups
        # The pod was replaced: the old endpoint is down and the name now answers with the new one.
        resolver.table["talker.ns"] = ["10.0.0.2"]
        pool.mark_down(pool.replicas[0], "test: connection refused")
        took = await until(lambda: members(pool) == {"10.0.0.2:1": False})
    assert took < 1.0 and discovery.lookups == before + 1
    await pool.close()


async def test_nothing_routable_re_resolves_and_bursts_of_failures_cost_one_lookup() -> None:
    resolver = FakeResolver({})
    pool = ReplicaPool("codec", ["codec.ns:1"], ready, static_only=True)
    discovery = Discovery(pool, ["codec.ns:1"], resolver, interval_s=3600)
    await discovery.resolve_now()
    assert pool.replicas == []
    async with running(discovery):
        await asyncio.sleep(0.6)
        before = discovery.lookups
        for _ in range(20):  # twenty requests refused at once: one lookup
            with pytest.raises(GatewayError):
                pool.pick()
        await asyncio.sleep(0.3)
        assert discovery.lookups == before + 1
        resolver.table["codec.ns"] = ["10.0.0.5"]
        # Nothing routable: looked up every EMPTY_RERESOLVE_S even with no request to trigger it.
        await until(lambda: "10.0.0.5:1" in members(pool), limit_s=2.0)
    await pool.close()


async def test_least_loaded_spans_discovered_replicas_with_reported_load_breaking_ties() -> None:
    loads = {"10.0.0.1:1": 3, "10.0.0.2:1": 0}

    async def status(replica: Replica) -> stage_pb2.StageStatus:
        return stage_pb2.StageStatus(ready=True, active_streams=loads[replica.address])

    resolver = FakeResolver({"talker.ns": ["10.0.0.1", "10.0.0.2"]})
    pool = ReplicaPool("talker", ["talker.ns:1"], status, static_only=True)
    await Discovery(pool, ["talker.ns:1"], resolver, interval_s=60).resolve_now()
    await pool.probe_all(force=True)
    assert {pool.pick().address for _ in range(5)} == {"10.0.0.2:1"}  # equal in_flight: the stage's load
    pool.find("10.0.0.2:1").in_flight = 2  # type: ignore[union-attr]
    assert pool.pick().address == "10.0.0.1:1"  # this gateway's own count comes first
    await pool.close()


async def test_system_resolver_reads_the_test_hosts_file_only_when_set(tmp_path: Path) -> None:
    hosts = tmp_path / "hosts"
    hosts.write_text("# test map\ntalkers.test 127.0.0.2 127.0.0.3\n")
    seam = SystemResolver(str(hosts))
    assert await seam.resolve("talkers.test") == ["127.0.0.2", "127.0.0.3"]
    hosts.write_text("talkers.test 127.0.0.3\n")  # re-read on every lookup
    assert await seam.resolve("TALKERS.test") == ["127.0.0.3"]
    assert await seam.resolve("localhost") == ["127.0.0.1"]  # not in the map: the system's answer, IPv4
    assert await SystemResolver().resolve("127.0.0.9") == ["127.0.0.9"]
    with pytest.raises(ResolveError):
        await SystemResolver().resolve("talkers.test")  # off by default: the map is not consulted
