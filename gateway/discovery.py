"""Stage discovery: keep each replica pool equal to what its configured addresses resolve to now.

A configured address is ``host:port``. An IP literal is one replica, fixed (never resolved). A name (a
Kubernetes headless Service such as ``talker.ns.svc.cluster.local:50061``, a compose service) stands for
every address it resolves to, each a replica on that port. Names are resolved through a
``voxstage.resolver.Resolver`` at start, every ``gateway.discovery_interval_s``, and at once (at most every
``MIN_RERESOLVE_GAP_S``) when routing meets a failure that a fresh answer may fix: a replica marked down,
or no replica routable. While nothing is routable they are re-resolved every ``EMPTY_RERESOLVE_S``.

An endpoint new in the answer is added and probed; one gone from it is drained (no new work; its streams
finish on it; it is dropped once they have; routing.py). A name that fails to resolve keeps its last
answer: a DNS outage must not empty a pool of replicas that still serve, and a replica that really died is
taken out by its health probes anyway.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gateway.tasks import wait_event
from voxstage.resolver import ResolveError, Resolver, is_ip_literal, join_host_port, split_host_port

if TYPE_CHECKING:
    from gateway.routing import ReplicaPool

log = logging.getLogger(__name__)

MIN_RERESOLVE_GAP_S = 0.5  # failures come in bursts (every stream on a dead replica): one lookup for all
EMPTY_RERESOLVE_S = 1.0  # how often names are looked up while no replica of the stage is routable
RESOLVE_TIMEOUT_S = 5.0


def parse_addresses(spec: str | Sequence[str], *, flag: str) -> list[str]:
    """``host:port[,host:port...]`` (or a list of them) -> list; a malformed entry is a usage error
    naming the flag or key."""
    raws = spec.split(",") if isinstance(spec, str) else list(spec)
    out: list[str] = []
    for raw in raws:
        addr = raw.strip()
        host, sep, port = addr.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"{flag}: {raw!r} is not host:port")
        out.append(addr)
    if len(set(out)) != len(out):
        raise ValueError(f"{flag}: duplicate address in {spec!r}")
    return out


@dataclass(frozen=True)
class Target:
    address: str  # as configured
    host: str
    port: int

    @classmethod
    def parse(cls, address: str) -> Target:
        host, port = split_host_port(address)
        return cls(address, host, port)

    @property
    def static(self) -> bool:
        return is_ip_literal(self.host)


class Discovery:
    """Resolves one pool's named targets and applies the answer to the pool's membership."""

    def __init__(
        self, pool: ReplicaPool, addresses: Sequence[str], resolver: Resolver, interval_s: float
    ) -> None:
        self.pool = pool
        self.targets = [Target.parse(a) for a in addresses]
        self.names = [t for t in self.targets if not t.static]
        self.resolver = resolver
        self.interval_s = interval_s
        self.lookups = 0  # resolutions done (diagnostic, and what the tests count)
        self._kick = asyncio.Event()
        self._last = float("-inf")
        if self.names:
            pool.on_failure = self.request

    @property
    def active(self) -> bool:
        """Whether any target is a name (an all-IP list is static: nothing to resolve, no task runs)."""
        return bool(self.names)

    def request(self) -> None:
        """Re-resolve soon: routing met a failure that new endpoints may fix."""
        self._kick.set()

    async def resolve_now(self) -> None:
        self._last = time.monotonic()
        self.lookups += 1
        answers = await asyncio.gather(*(self._lookup(t) for t in self.names))
        desired: dict[str, str] = {t.address: t.address for t in self.targets if t.static}
        for target, ips in zip(self.names, answers, strict=True):
            if ips is None:  # keep the last answer (module docstring)
                kept = [r for r in self.pool.replicas if r.source == target.address and not r.draining]
                desired.update({r.address: target.address for r in kept})
                continue
            desired.update({join_host_port(ip, target.port): target.address for ip in ips})
        for address, source in desired.items():
            self.pool.add(address, source=source)
        for replica in list(self.pool.replicas):
            if replica.address not in desired and not replica.draining:
                self.pool.drain(replica)

    async def _lookup(self, target: Target) -> list[str] | None:
        try:
            ips = await asyncio.wait_for(self.resolver.resolve(target.host), RESOLVE_TIMEOUT_S)
        except (ResolveError, TimeoutError) as exc:
            why = f"does not resolve: {exc or f'no answer within {RESOLVE_TIMEOUT_S:g} s'}"
            if self.pool.resolve_errors.get(target.address) != why:
                stage = self.pool.stage
                log.warning("%s %s %s (its last answer is kept)", stage, target.address, why)
            self.pool.resolve_errors[target.address] = why
            return None
        if self.pool.resolve_errors.pop(target.address, None) is not None:
            log.info("%s %s resolves again: %s", self.pool.stage, target.address, ", ".join(ips))
        return ips

    async def run(self) -> None:
        """Re-resolve every ``interval_s``, sooner on request or while nothing is routable."""
        while True:
            every = self.interval_s if self.pool.candidates() else min(self.interval_s, EMPTY_RERESOLVE_S)
            wait = max(self._last + every - time.monotonic(), 0.0)
            await wait_event(self._kick, wait)
            gap = self._last + MIN_RERESOLVE_GAP_S - time.monotonic()
            if gap > 0:
                await asyncio.sleep(gap)
            self._kick.clear()
            try:
                await self.resolve_now()
            except Exception:  # noqa: BLE001 - a bug here must not stop discovery for good
                log.exception("%s: discovery failed", self.pool.stage)
