"""Issue 17: ``--allowed-talkers`` entries may be names. A talker address is allowed when it equals an entry
or when what it resolves to is among what a same-port entry's name resolves to; everything else is still
PERMISSION_DENIED, and refused opens cannot become a flood of lookups."""

from __future__ import annotations

import pytest

from services.codec import allowlist
from services.codec.allowlist import TalkerAllowlist
from services.codec.upstream import TalkerPool
from tests.fake_resolver import FakeResolver
from voxstage.stage.errors import StageFailure


async def test_an_ip_behind_an_allowed_name_is_allowed_and_others_are_not() -> None:
    resolver = FakeResolver({"talkers.ns": ["10.0.0.1", "10.0.0.2"], "evil.example": ["10.6.6.6"]})
    allow = TalkerAllowlist(["Talkers.NS:50061", "10.0.0.9:50061"], resolver)
    assert await allow.admits("10.0.0.1:50061") and await allow.admits("10.0.0.2:50061")
    assert await allow.admits("talkers.ns:50061") and await allow.admits("10.0.0.9:50061")
    assert not await allow.admits("10.0.0.3:50061")  # not behind the name
    assert not await allow.admits("10.0.0.1:50062")  # the name's port only
    assert not await allow.admits("evil.example:50061")  # a name is judged by what it resolves to
    resolver.table["evil.example"] = ["10.0.0.1", "10.6.6.6"]
    allowlist_ttl_passed(allow)
    assert not await allow.admits("evil.example:50061")  # all of it must be allowed, not some
    resolver.table["evil.example"] = ["10.0.0.2"]
    allowlist_ttl_passed(allow)
    assert await allow.admits("evil.example:50061")


def allowlist_ttl_passed(allow: TalkerAllowlist) -> None:
    allow._cache = {k: (v[0], v[1] - allowlist.CACHE_TTL_S - 1) for k, v in allow._cache.items()}


async def test_answers_are_cached_and_a_miss_looks_again() -> None:
    resolver = FakeResolver({"talkers.ns": ["10.0.0.1"]})
    allow = TalkerAllowlist(["talkers.ns:50061"], resolver)
    for _ in range(5):
        assert await allow.admits("10.0.0.1:50061")
    assert resolver.asked == ["talkers.ns"]  # one lookup for five opens
    # A new replica behind the name: the cached answer misses it, so the miss looks again.
    resolver.table["talkers.ns"] = ["10.0.0.1", "10.0.0.2"]
    allowlist_ttl_passed(allow)  # older than the refresh floor (but within the TTL would do too)
    assert await allow.admits("10.0.0.2:50061")
    assert resolver.asked == ["talkers.ns", "talkers.ns"]


async def test_refused_opens_cost_one_lookup_per_refresh_floor(monkeypatch: pytest.MonkeyPatch) -> None:
    resolver = FakeResolver({"talkers.ns": ["10.0.0.1"]})
    allow = TalkerAllowlist(["talkers.ns:50061"], resolver)
    assert await allow.admits("10.0.0.1:50061")
    monkeypatch.setattr(allowlist, "CACHE_TTL_S", 0.0)  # every cached answer is stale, none is too young
    for i in range(50):
        assert not await allow.admits(f"10.9.0.{i}:50061")
    assert resolver.asked == ["talkers.ns"]  # all within MIN_REFRESH_S of the first lookup


async def test_ip_only_lists_never_resolve() -> None:
    resolver = FakeResolver({})
    allow = TalkerAllowlist(["10.0.0.1:50061", "[::1]:7"], resolver)
    assert await allow.admits("10.0.0.1:50061") and await allow.admits("[::1]:7")
    assert not await allow.admits("10.0.0.2:50061")
    assert resolver.asked == []


async def test_the_pool_denies_with_permission_denied_and_dials_what_it_checked() -> None:
    resolver = FakeResolver({"talkers.ns": ["127.0.0.2", "127.0.0.3"]})
    pool = TalkerPool(None, allowed=["talkers.ns:50061"], resolver=resolver)
    with pytest.raises(StageFailure) as err:
        await pool.check("127.0.0.4:50061")
    assert err.value.code == "PERMISSION_DENIED" and "127.0.0.4:50061" in err.value.message
    with pytest.raises(StageFailure):
        pool.peer("127.0.0.4:50061")  # the dial path refuses it too, without a lookup of its own
    await pool.check("127.0.0.3:50061")
    assert pool.peer("127.0.0.3:50061").address == "127.0.0.3:50061"
    assert resolver.asked == ["talkers.ns"]  # the miss came within the refresh floor: no second lookup
    await pool.close()
