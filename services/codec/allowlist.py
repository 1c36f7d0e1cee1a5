"""``--allowed-talkers`` by name: which talker addresses a codec may dial.

An address is allowed when it equals an entry (host compared case-insensitively), or when every address
its host resolves to (itself, for an IP literal) is among what the entries with the same port resolve to.
That lets a gateway that discovered the talkers behind ``talker.ns.svc.cluster.local:50061`` send their
pod IPs, while anything else stays PERMISSION_DENIED. Answers are cached for ``CACHE_TTL_S``; a miss looks
the names up again (a pod that just started is not in a stale answer), but at most every
``MIN_REFRESH_S`` per name, so a stream of refused opens cannot turn into a stream of DNS queries.
"""

from __future__ import annotations

import ipaddress
import time
from collections.abc import Iterable

from voxstage.resolver import ResolveError, Resolver, is_ip_literal, split_host_port

CACHE_TTL_S = 5.0
MIN_REFRESH_S = 0.5
MAX_FOREIGN_NAMES = 256  # names from requests (not entries) kept in the cache


def _ip(text: str) -> str:
    return str(ipaddress.ip_address(text.strip("[]")))


class TalkerAllowlist:
    def __init__(self, entries: Iterable[str], resolver: Resolver) -> None:
        self.entries = frozenset(e.strip().lower() for e in entries)
        self.resolver = resolver
        self._hosts_by_port: dict[int, list[str]] = {}
        for entry in sorted(self.entries):
            host, port = split_host_port(entry)
            self._hosts_by_port.setdefault(port, []).append(host)
        hosts = [h for entry_hosts in self._hosts_by_port.values() for h in entry_hosts]
        self._entry_names = {h for h in hosts if not is_ip_literal(h)}
        self._cache: dict[str, tuple[frozenset[str], float]] = {}  # name -> (addresses, looked up at)

    async def admits(self, address: str) -> bool:
        address = address.strip().lower()
        if address in self.entries:
            return True
        return await self._match(address, refresh=False) or await self._match(address, refresh=True)

    def admits_cached(self, address: str) -> bool:
        """As ``admits`` with the cached answers only (no lookup): for the dial right after a check."""
        address = address.strip().lower()
        if address in self.entries:
            return True
        try:
            host, port = split_host_port(address)
        except ValueError:
            return False
        wanted = self._cached(host)
        allowed = set().union(*(self._cached(h) for h in self._hosts_by_port.get(port, [])))
        return bool(wanted) and wanted <= allowed

    def _cached(self, host: str) -> frozenset[str]:
        return frozenset({_ip(host)}) if is_ip_literal(host) else self._cache.get(host, (frozenset(), 0.0))[0]

    async def _match(self, address: str, *, refresh: bool) -> bool:
        try:
            host, port = split_host_port(address)
        except ValueError:
            return False
        hosts = self._hosts_by_port.get(port)
        if not hosts or not any(not is_ip_literal(h) for h in [host, *hosts]):
            return False  # only IP literals on both sides: the exact comparison already said no
        wanted = await self._addresses(host, refresh)
        allowed: set[str] = set()
        for entry_host in hosts:
            allowed |= await self._addresses(entry_host, refresh)
        return bool(wanted) and wanted <= allowed

    async def _addresses(self, host: str, refresh: bool) -> frozenset[str]:
        if is_ip_literal(host):
            return frozenset({_ip(host)})
        cached = self._cache.get(host)
        now = time.monotonic()
        if cached is not None:
            age = now - cached[1]
            if age < MIN_REFRESH_S or (age < CACHE_TTL_S and not refresh):
                return cached[0]
        try:
            found = frozenset(_ip(a) for a in await self.resolver.resolve(host))
        except ResolveError:
            found = frozenset()
        if host not in self._entry_names and len(self._cache) >= MAX_FOREIGN_NAMES + len(self._entry_names):
            self._cache = {k: v for k, v in self._cache.items() if k in self._entry_names}
        self._cache[host] = (found, now)
        return found
