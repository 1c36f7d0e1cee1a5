"""Name resolution for stage addresses: the seam between discovery and DNS.

A stage address ``host:port`` whose host is a name (a Kubernetes headless Service, a compose service) may
stand for many endpoints. ``Resolver.resolve`` turns the host into the IP addresses it currently names;
the gateway's discovery (gateway/discovery.py) and the codec's talker allowlist (services/codec/upstream.py)
both go through it, so tests drive both with one fake.

``SystemResolver`` asks the operating system (``loop.getaddrinfo``: /etc/hosts, DNS, nsswitch). For tests
only, ``VOXSTAGE_TEST_RESOLVER_FILE`` names a hosts-style file (``name addr [addr ...]`` per line, ``#``
comments) that it consults first and re-reads on every lookup, so a test can add and remove endpoints of a
name while the processes run and exercise the real re-resolution paths. It is off unless set, and the
process logs a warning when it is on.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import os
import socket
from pathlib import Path
from typing import Protocol

log = logging.getLogger(__name__)

TEST_RESOLVER_ENV = "VOXSTAGE_TEST_RESOLVER_FILE"


class ResolveError(Exception):
    """The name does not resolve now (NXDOMAIN, no answer, the resolver unreachable)."""


class Resolver(Protocol):
    async def resolve(self, host: str) -> list[str]:
        """The IP addresses ``host`` names now, in a stable order; raises ``ResolveError``."""
        ...


def split_host_port(address: str) -> tuple[str, int]:
    """``host:port`` / ``[v6]:port`` -> (host without brackets, port)."""
    host, sep, port = address.strip().rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"{address!r} is not host:port")
    return host.strip("[]"), int(port)


def join_host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def is_ip_literal(host: str) -> bool:
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    return True


def prefer_one_family(addresses: list[str]) -> list[str]:
    """IPv4 addresses when there are any, else IPv6: a dual-stack name (``localhost``, a dual-stack pod)
    lists each endpoint once per family, and counting it twice would make one process two replicas."""
    v4 = [a for a in addresses if ipaddress.ip_address(a).version == 4]
    return v4 or addresses


def read_hosts_file(path: Path) -> dict[str, list[str]]:
    table: dict[str, list[str]] = {}
    for line in path.read_text().splitlines():
        fields = line.split("#", 1)[0].split()
        if len(fields) >= 2:
            table.setdefault(fields[0].lower(), []).extend(str(ipaddress.ip_address(f)) for f in fields[1:])
    return table


class SystemResolver:
    """The operating system's resolver; in tests, first the ``VOXSTAGE_TEST_RESOLVER_FILE`` map."""

    def __init__(self, hosts_file: str | None = None) -> None:
        self.hosts_file = Path(hosts_file) if hosts_file else None
        if self.hosts_file is not None:
            log.warning(
                "%s=%s: names listed there resolve from that file (a test seam; never set it in production)",
                TEST_RESOLVER_ENV,
                self.hosts_file,
            )

    @classmethod
    def from_env(cls) -> SystemResolver:
        return cls(os.environ.get(TEST_RESOLVER_ENV) or None)

    async def resolve(self, host: str) -> list[str]:
        if self.hosts_file is not None:
            try:
                table = read_hosts_file(self.hosts_file)
            except (OSError, ValueError) as exc:
                raise ResolveError(f"{host}: cannot read {self.hosts_file}: {exc}") from exc
            if host.lower() in table:
                found = table[host.lower()]
                if not found:
                    raise ResolveError(f"{host}: no address in {self.hosts_file}")
                return sorted(set(found))
        try:
            infos = await asyncio.get_running_loop().getaddrinfo(host, None, type=socket.SOCK_STREAM)
        except OSError as exc:  # socket.gaierror included
            raise ResolveError(f"{host}: {exc}") from exc
        found = sorted({str(info[4][0]).split("%", 1)[0] for info in infos})
        if not found:
            raise ResolveError(f"{host}: no address")
        return prefer_one_family(found)
