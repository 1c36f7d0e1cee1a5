"""Fair sharing between clients (issue 26): limits per API key, or per connection when keys are off.

Without them one client could hold every slot (ten that never read held the seed file's ten for 45 s) or
refuse everyone else by asking faster. A client may have, at once, at most ``streams`` speech requests
(``Synthesize``, ``StreamingSynthesize``, ``POST /v1/audio/speech``, queued or running) and ``sessions``
duplex sessions (``Converse``, ``/v1/realtime``), and may start at most ``rate`` of either per second (a
token bucket holding ``max(1, rate)`` starts, so a client that paused may start a few at once).

With API keys on, the limits are the key's own, from its line in ``gateway.api_keys_file``
(``KEY streams=4 sessions=1 rate=2/s name=team-a``; a key without options, or from ``api_keys_env``, has
none); with keys off, every client connection gets ``gateway.connection_max_streams``,
``connection_max_sessions`` and ``connection_rate``. Refusals are RESOURCE_EXHAUSTED / HTTP 429 with a
retry hint, before the request touches admission or a stage. Keys are never named in messages or logs: a
key's ``name`` is, or "this API key".
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import grpc

from gateway.errors import GatewayError

STREAM, SESSION = "stream", "session"
BUSY_RETRY_S = 1.0  # a client at its concurrency limit: about when one of its streams may have ended
_PURGE_AT = 10_000  # idle per-connection entries are dropped once there are this many


class LimitsError(ValueError):
    """A key file option that cannot be used; the message names it."""


@dataclass(frozen=True)
class ClientLimits:
    streams: int | None = None
    sessions: int | None = None
    rate: float | None = None  # starts per second
    name: str = ""

    @property
    def any(self) -> bool:
        return self.streams is not None or self.sessions is not None or self.rate is not None


def parse_rate(text: str) -> float:
    """``N/s``, ``N/min`` or ``N/h`` (N > 0) as starts per second."""
    count, _, unit = text.partition("/")
    per = {"s": 1.0, "min": 60.0, "h": 3600.0}.get(unit)
    try:
        value = float(count)
    except ValueError:
        value = math.nan
    if per is None or not (math.isfinite(value) and value > 0):
        raise LimitsError(f"rate={text}: must be a positive count per s, min or h (rate=2/s, rate=30/min)")
    return value / per


def parse_key_options(options: list[str]) -> ClientLimits:
    """The ``name=value`` words after a key on its line of the key file."""
    values: dict[str, object] = {}
    for option in options:
        name, sep, value = option.partition("=")
        if not sep or not value:
            raise LimitsError(f"{option!r}: an option after a key is streams=, sessions=, rate= or name=")
        if name in ("streams", "sessions"):
            if not value.isdigit() or int(value) < 1:
                raise LimitsError(f"{name}={value}: must be a whole number >= 1")
            values[name] = int(value)
        elif name == "rate":
            values[name] = parse_rate(value)
        elif name == "name":
            values[name] = value
        else:
            raise LimitsError(f"{name}: unknown option; a key takes streams, sessions, rate and name")
    return ClientLimits(**values)  # type: ignore[arg-type]


@dataclass
class _Client:
    limits: ClientLimits
    label: str
    active: dict[str, int] = field(default_factory=lambda: {STREAM: 0, SESSION: 0})
    tokens: float = 0.0
    stamp: float = 0.0

    def idle(self, now: float) -> bool:
        full = self.limits.rate is None or self._refilled(now) >= self._burst()
        return not any(self.active.values()) and full

    def _burst(self) -> float:
        return max(1.0, self.limits.rate or 0.0)

    def _refilled(self, now: float) -> float:
        assert self.limits.rate is not None
        return min(self._burst(), self.tokens + (now - self.stamp) * self.limits.rate)

    def take(self, now: float) -> float | None:
        """Take one start; None when allowed, else the seconds until one is."""
        if self.limits.rate is None:
            return None
        self.tokens, self.stamp = self._refilled(now), now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return None
        return (1.0 - self.tokens) / self.limits.rate


class Quotas:
    def __init__(
        self,
        keys: Mapping[bytes, ClientLimits] | None = None,
        per_connection: ClientLimits | None = None,
        *,
        match: Callable[[str | bytes | None], bytes | None] | None = None,
        clock: object = time.monotonic,
    ) -> None:
        """``keys``: each API key's limits (keys on: ``match`` finds the key an Authorization value
        carries); None: keys are off and every connection has ``per_connection``."""
        self.keys = dict(keys or {})
        self.keys_on = keys is not None
        self.match = match or (lambda _: None)
        self.per_connection = per_connection or ClientLimits()
        self._clock = clock
        self._clients: dict[object, _Client] = {}

    def client_of(self, authorization: str | bytes | None, peer: str) -> tuple[object, ClientLimits, str]:
        """Who is asking: the API key ``authorization`` carries when keys are on, else the connection."""
        if self.keys_on:
            key = self.match(authorization)
            limits = self.keys.get(key or b"", ClientLimits())
            return ("key", key), limits, f"API key {limits.name}" if limits.name else "this API key"
        return ("peer", peer), self.per_connection, "this connection"

    @contextlib.contextmanager
    def hold(self, authorization: str | bytes | None, peer: str, kind: str) -> Iterator[None]:
        """One stream or session of a client for the ``with`` block, or RESOURCE_EXHAUSTED now."""
        release = self.acquire(authorization, peer, kind)
        try:
            yield
        finally:
            release()

    def acquire(self, authorization: str | bytes | None, peer: str, kind: str) -> Callable[[], None]:
        """Take one stream or session of a client (RESOURCE_EXHAUSTED when it is at a limit); returns the
        function that gives it back (idempotent)."""
        ident, limits, label = self.client_of(authorization, peer)
        if not limits.any:
            return _nothing
        now = self._clock()  # type: ignore[operator]
        client = self._clients.get(ident)
        if client is None:
            if len(self._clients) >= _PURGE_AT:
                self._clients = {k: c for k, c in self._clients.items() if not c.idle(now)}
            burst = max(1.0, limits.rate or 0.0)
            client = self._clients[ident] = _Client(limits, label, tokens=burst, stamp=now)
        cap = limits.streams if kind == STREAM else limits.sessions
        if cap is not None and client.active[kind] >= cap:
            why = f"{client.active[kind]} {kind}s open, its limit of {cap} ({_source(self, kind)})"
            raise _refused(label, why, BUSY_RETRY_S, "client_limit_reached")
        wait = client.take(now)
        if wait is not None:
            why = f"more than {limits.rate:g} new requests a second ({_source(self, 'rate')})"
            raise _refused(label, why, wait, "rate_limited")
        client.active[kind] += 1
        held = [True]

        def release() -> None:
            if not held:
                return
            held.clear()
            client.active[kind] -= 1
            if client.idle(self._clock()):  # type: ignore[operator]
                self._clients.pop(ident, None)

        return release


def _nothing() -> None:
    pass


def client_of(context: Any) -> tuple[str | None, str]:
    """A gRPC call's (``authorization`` metadata, connection): who it is to the limits."""
    metadata = context.invocation_metadata() or ()
    auth = next((v for k, v in metadata if k == "authorization"), None)
    return (auth if isinstance(auth, str | bytes) else None), context.peer()


def http_client_of(headers: Any, scope: Mapping[str, Any]) -> tuple[str | None, str]:
    """An HTTP request's or WebSocket's (``Authorization`` header, connection)."""
    host, port = scope.get("client") or ("?", 0)
    return headers.get("authorization"), f"{host}:{port}"


def _source(quotas: Quotas, what: str) -> str:
    if quotas.keys_on:
        return f"the key's {what}s= in gateway.api_keys_file" if what != "rate" else "the key's rate="
    return f"gateway.connection_max_{what}s" if what != "rate" else "gateway.connection_rate"


def _refused(label: str, why: str, retry_s: float, reason: str) -> GatewayError:
    code = grpc.StatusCode.RESOURCE_EXHAUSTED
    return GatewayError(code, f"{label}: {why}", field="admission", retry_after_s=retry_s, reason=reason)
