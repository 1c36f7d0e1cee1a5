"""The codec's connections to talkers: one channel per talker address, each with its cached hello.

A channel is reused by every request to that talker. When a stream to it fails at the transport level
(the talker died or restarted), the channel is dropped, so the next request dials afresh instead of
waiting out gRPC's reconnect backoff on a stale channel, and its hello (the talker's shm probe) is fetched
again. Peer death also reaps the dead talker's shared-memory files (docs/protocol.md §9).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from services.codec.allowlist import TalkerAllowlist
from voxstage.internal.v1 import stage_pb2, stage_pb2_grpc
from voxstage.link.client import LinkClient
from voxstage.link.wire import TALKER_REQUESTS, TALKER_RESPONSES
from voxstage.quote import quoted
from voxstage.resolver import Resolver, SystemResolver
from voxstage.server import CHANNEL_OPTIONS
from voxstage.stage.errors import StageFailure
from voxstage.stage.tls import LinkTls, aio_channel
from voxstage.transport.host import Hello
from voxstage.transport.payload import hello_from_proto
from voxstage.transport.shm import ShmReader, ShmWriter
from voxstage.transport.shm_layout import DEFAULT_SHM_DIR

log = logging.getLogger(__name__)

# A talker that restarts should be reachable again within a second, not after gRPC's default 1-120 s backoff.
UPSTREAM_CHANNEL_OPTIONS = [
    *CHANNEL_OPTIONS,
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
]
STATUS_TIMEOUT_S = 5.0
REAP_ATTEMPTS = 15
REAP_INTERVAL_S = 0.02


@dataclass
class TalkerPeer:
    address: str
    channel: grpc.aio.Channel
    stub: stage_pb2_grpc.TalkerStub
    hello: Hello | None = None
    serves_link: bool = False  # its Status offers Link (docs/protocol.md §12)
    link: LinkClient | None = None
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)


def parse_allowed_talkers(text: str | None) -> frozenset[str] | None:
    """``--allowed-talkers``: comma-separated ``host:port`` entries; None or blank means any talker."""
    if not text or not text.strip():
        return None
    entries = [e.strip() for e in text.split(",") if e.strip()]
    for entry in entries:
        host, sep, port = entry.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"--allowed-talkers: {entry!r} is not host:port")
    return frozenset(_normal(e) for e in entries)


def _normal(address: str) -> str:
    return address.strip().lower()


class TalkerPool:
    """``allowed``: the only talker addresses this codec dials (``--allowed-talkers``); None allows any.
    Every dial goes through ``peer``, so a ``StreamOpen.talker_address`` outside the list is refused
    (PERMISSION_DENIED) before any channel exists. ``tls``: mutual TLS on every talker channel
    (``--link-*``); None dials plain gRPC."""

    def __init__(
        self,
        reader: ShmReader | None,
        shm_dir: str | Path = DEFAULT_SHM_DIR,
        *,
        allowed: Iterable[str] | None = None,
        tls: LinkTls | None = None,
        resolver: Resolver | None = None,
    ) -> None:
        self.tls = tls
        self.reader = reader
        self._shm_dir = Path(shm_dir)
        self._peers: dict[str, TalkerPeer] = {}
        self._resolver = resolver or SystemResolver.from_env()
        self.allowed = None if allowed is None else frozenset(_normal(a) for a in allowed)

    @property
    def allowed(self) -> frozenset[str] | None:
        return self._allowed

    @allowed.setter
    def allowed(self, value: frozenset[str] | None) -> None:
        self._allowed = value
        self._allowlist = TalkerAllowlist(value or (), self._resolver)

    async def check(self, address: str) -> None:
        """Refuse a talker address this codec is not configured to dial (docs/protocol.md §7). An entry
        that is a name allows what it resolves to (``TalkerAllowlist``), so a gateway that discovered
        the talkers behind that name may send their IPs."""
        if self.allowed is not None and not await self._allowlist.admits(address):
            raise self._denied(address)

    def _denied(self, address: str) -> StageFailure:
        why = f"talker_address: {quoted(address)} is not one of this codec's --allowed-talkers"
        return StageFailure("PERMISSION_DENIED", why)

    def peer(self, address: str) -> TalkerPeer:
        # Every dial passes here; ``check`` ran on the stream's open, so the answers it used are cached.
        if self.allowed is not None and not self._allowlist.admits_cached(address):
            raise self._denied(address)
        peer = self._peers.get(address)
        if peer is None:
            channel = aio_channel(address, UPSTREAM_CHANNEL_OPTIONS, self.tls)
            peer = TalkerPeer(address, channel, stage_pb2_grpc.TalkerStub(channel))
            self._peers[address] = peer
        return peer

    def current(self, peer: TalkerPeer) -> TalkerPeer:
        """``peer`` while it is still this address's channel, else the one that replaced it (a fresh dial).
        A request takes its peer before it awaits anything; meanwhile another stream to the same talker may
        break and drop (close) that shared channel, and a call on a closed channel is a usage error, not the
        UNAVAILABLE that lets the gateway try another talker."""
        return peer if self._peers.get(peer.address) is peer else self.peer(peer.address)

    async def hello(self, peer: TalkerPeer) -> Hello:
        """The talker's transport hello (from Talker.Status), cached for the channel's lifetime."""
        async with peer._lock:
            if peer.hello is None:
                try:
                    reply = await peer.stub.Status(stage_pb2.TalkerStatusRequest(), timeout=STATUS_TIMEOUT_S)
                except grpc.aio.AioRpcError as exc:
                    self.drop(peer)
                    raise StageFailure(
                        "UNAVAILABLE",
                        f"talker {peer.address} is unreachable: {exc.code().name}: {exc.details()}",
                    ) from exc
                except grpc.aio.UsageError as exc:  # dropped while this waited for the lock (see ``current``)
                    message = f"talker {peer.address}: its channel broke (another stream to it failed)"
                    raise StageFailure("UNAVAILABLE", message) from exc
                if not reply.status.ready:
                    raise StageFailure(
                        "UNAVAILABLE", f"talker {peer.address} is not ready (warming up or draining)"
                    )
                peer.hello = hello_from_proto(reply.status.transport)
                peer.serves_link = reply.status.link
            return peer.hello

    def link(self, peer: TalkerPeer, writer: ShmWriter | None) -> LinkClient | None:
        """The link every request to this talker shares, or None when it offers none (an older talker)."""
        if not peer.serves_link:
            return None
        if peer.link is None:
            peer.link = LinkClient(
                f"talker {peer.address}",
                peer.stub.Link,
                TALKER_REQUESTS,
                TALKER_RESPONSES,
                writer=writer,
                reader=self.reader,
            )
        return peer.link

    def refresh(self, peer: TalkerPeer, hello: Hello) -> None:
        """The talker's opened carried a different probe (it restarted behind the same address)."""
        if peer.hello is not None and peer.hello.probe_region != hello.probe_region:
            peer.hello = hello

    def drop(self, peer: TalkerPeer) -> None:
        """Forget a broken channel: the next request to this address dials a new one."""
        if self._peers.get(peer.address) is peer:
            del self._peers[peer.address]
        if peer.link is not None:
            peer.link.close()
        # Closing with no grace cancels nothing else: every stream on it has already failed.
        task = asyncio.ensure_future(peer.channel.close())
        task.add_done_callback(lambda t: t.exception())

    async def reap(self, probe_region: str) -> list[str]:
        """After a stream from the talker owning ``probe_region`` broke: if that talker is dead, unlink its
        shared-memory files. The kernel drops a killed process's socket and lock in one exit, but the
        broken stream can be seen a moment before the lock, so a still-held lock is retried briefly."""
        if self.reader is None or not probe_region:
            return []
        for _ in range(REAP_ATTEMPTS):
            removed = self.reader.reap_peer(probe_region)
            if removed or not (self._shm_dir / probe_region).exists():
                if removed:
                    log.info("reaped %d shared-memory file(s) of dead talker %s", len(removed), probe_region)
                return removed
            await asyncio.sleep(REAP_INTERVAL_S)
        return []  # the owner is alive: the stream broke for another reason

    async def close(self) -> None:
        peers, self._peers = list(self._peers.values()), {}
        for peer in peers:
            if peer.link is not None:
                peer.link.close()
            await peer.channel.close()
