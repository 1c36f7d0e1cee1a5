"""A resolver double for discovery and allowlist tests: names map to address lists the test edits."""

from __future__ import annotations

from voxstage.resolver import ResolveError


class FakeResolver:
    def __init__(self, table: dict[str, list[str]]) -> None:
        self.table = table
        self.asked: list[str] = []

    async def resolve(self, host: str) -> list[str]:
        self.asked.append(host)
        if host not in self.table:
            raise ResolveError(f"{host}: NXDOMAIN")
        return list(self.table[host])
