"""Same-host shared-memory fast path: writer-owned regions, references on the wire, release on ack.

The writer (one ``ShmWriter`` per process) copies a payload above ``threshold_bytes`` into a slot of one of
its regions and sends a ``ShmRef`` instead of the bytes; smaller payloads, and every payload for a peer that
cannot open its regions, go inline. The reader (``ShmReader``) copies the slot out, checks the slot's
generation before and after the copy, and acks the reference on the same stream; the ack frees the slot.

Reclamation when a peer dies:
- reader gone: the writer's per-stream ``ShmSender.close()`` (called when the stream ends or breaks) takes
  back every slot still lent on that stream;
- writer gone (``kill -9``): the reader calls ``ShmReader.reap_peer(probe)`` when the stream breaks, which
  unlinks the writer's files once the writer's lock shows it is dead; ``sweep_dead_regions()`` at process
  start removes whatever an earlier crash of both ends left behind.
Layout, naming and the liveness lock are described in ``shm_layout``.
"""

from __future__ import annotations

import itertools
import os
import secrets
import threading
import weakref
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from voxstage.transport.counters import (
    FALLBACK_CAPACITY,
    FALLBACK_NO_SPACE,
    FALLBACK_OVERSIZE,
    PATH_INLINE,
    PATH_SHM,
    TransportCounters,
    transport_counters,
)
from voxstage.transport.shm_layout import (
    DEFAULT_SHM_DIR,
    KIND_PROBE,
    KIND_SLAB,
    PAGE,
    InvalidShmReference,
    NoSpace,
    OwnedRegion,
    ShmError,
    ShmRef,
    StaleShmReference,
    create_region,
    parse_region_name,
    region_data_offset,
)
from voxstage.transport.shm_reader import ShmReader, sweep_dead_regions

__all__ = [
    "DEFAULT_MAX_TOTAL_BYTES",
    "DEFAULT_REGION_BYTES",
    "InvalidShmReference",
    "ShmError",
    "ShmReader",
    "ShmRef",
    "ShmSender",
    "ShmWriter",
    "StaleShmReference",
    "UnknownShmAck",
    "WriterStats",
    "sweep_dead_regions",
]

DEFAULT_REGION_BYTES = 4 << 20
DEFAULT_MAX_TOTAL_BYTES = 256 << 20

Bytes = bytes | bytearray | memoryview


class UnknownShmAck(ShmError, ValueError):
    """An ack names a slot that is not lent on this stream (a peer bug: acked twice, or never sent)."""


@dataclass(frozen=True, slots=True)
class WriterStats:
    regions: int
    mapped_bytes: int
    slots_total: int
    slots_lent: int
    streams_with_loans: int


class _NoRoom(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _slot_size(nbytes: int) -> int:
    # Power-of-two size classes: a slot of class c holds anything in (c/2, c], so waste is below 2x and a
    # released slot fits the next payload of a steady stream (same chunk size every time).
    return max(PAGE, 1 << (nbytes - 1).bit_length())


def _destroy_all(regions: list[OwnedRegion], owner_pid: int) -> None:
    # Slab regions first, the probe (regions[0]) last: while the probe is locked, sweepers skip the rest.
    for region in reversed(regions):
        region.destroy(owner_pid)
    regions.clear()


class ShmWriter:
    """The process's shared-memory regions and the slots lent out of them."""

    def __init__(
        self,
        *,
        threshold_bytes: int,
        region_bytes: int = DEFAULT_REGION_BYTES,
        max_total_bytes: int = DEFAULT_MAX_TOTAL_BYTES,
        shm_dir: str | Path = DEFAULT_SHM_DIR,
        counters: TransportCounters | None = None,
        file_mode: int = 0o600,
    ) -> None:
        if isinstance(threshold_bytes, bool) or not isinstance(threshold_bytes, int) or threshold_bytes < 0:
            raise ValueError(f"threshold_bytes must be a non-negative int, got {threshold_bytes!r}")
        if region_bytes < PAGE:
            raise ValueError(f"region_bytes must be at least one page ({PAGE}), got {region_bytes}")
        if max_total_bytes < region_bytes + PAGE:
            raise ValueError(
                f"max_total_bytes ({max_total_bytes}) must leave room for one region ({region_bytes}) "
                f"plus the probe page ({PAGE})"
            )
        self.threshold_bytes = threshold_bytes
        self._region_bytes = region_bytes
        self._max_total = max_total_bytes
        self._dir = Path(shm_dir)
        self._mode = file_mode
        self._counters = counters if counters is not None else transport_counters
        self._pid = os.getpid()
        self._token = secrets.token_hex(8)
        self.prefix = f"voxstage-{self._pid}-{self._token}"
        self._lock = threading.Lock()
        probe = create_region(
            self._dir,
            f"{self.prefix}-probe",
            kind=KIND_PROBE,
            slot_size=0,
            slot_count=0,
            token=self._token,
            mode=self._mode,
        )
        # regions[0] is the probe; slab region r<n> is regions[n + 1].
        self._regions: list[OwnedRegion] = [probe]
        self._by_class: dict[int, list[int]] = {}
        self._mapped = probe.size
        self._lent: dict[tuple[int, int], tuple[int, int]] = {}  # (region, slot) -> (stream, generation)
        self._by_stream: dict[int, set[tuple[int, int]]] = {}
        self._stream_ids = itertools.count(1)
        self._finalizer = weakref.finalize(self, _destroy_all, self._regions, self._pid)

    @property
    def probe_region(self) -> str:
        """Name of the probe a peer opens to prove it can read this writer's regions."""
        return f"{self.prefix}-probe"

    @property
    def closed(self) -> bool:
        return not self._finalizer.alive

    def peer_can_read(self, verified_peer_probe: str) -> bool:
        """True if the peer's hello says it opened *this* writer's probe (not an earlier process's)."""
        return bool(verified_peer_probe) and verified_peer_probe == self.probe_region

    def sender(self, *, peer_readable: bool) -> ShmSender:
        """A per-stream handle; streams are tracked separately even when they share a request id."""
        with self._lock:
            stream = next(self._stream_ids)
        return ShmSender(self, stream, peer_readable)

    def stats(self) -> WriterStats:
        with self._lock:
            slabs = self._regions[1:]
            return WriterStats(
                regions=len(slabs),
                mapped_bytes=self._mapped,
                slots_total=sum(r.header.slot_count for r in slabs),
                slots_lent=len(self._lent),
                streams_with_loans=len(self._by_stream),
            )

    def close(self) -> None:
        """Invalidates every outstanding reference and unlinks all regions (also runs at interpreter exit)."""
        with self._lock:
            self._lent.clear()
            self._by_stream.clear()
            self._finalizer()

    # ---- used by ShmSender ----

    def _place(self, data: Bytes, stream: int, peer_readable: bool) -> bytes | ShmRef:
        view = memoryview(data).cast("B")
        nbytes = view.nbytes
        if not peer_readable or nbytes <= self.threshold_bytes:
            self._counters.count_payload(PATH_INLINE, nbytes)
            return bytes(view)
        try:
            ref = self._lend(view, stream)
        except _NoRoom as exc:
            self._counters.count_fallback(exc.reason)
            self._counters.count_payload(PATH_INLINE, nbytes)
            return bytes(view)
        self._counters.count_payload(PATH_SHM, nbytes)
        return ref

    def _lend(self, view: memoryview, stream: int) -> ShmRef:
        size = _slot_size(view.nbytes)
        with self._lock:
            if self.closed:
                raise ShmError(f"shared-memory writer {self.prefix} is closed")
            index, slot = self._take_slot(size)
            region = self._regions[index]
            # Odd generation = lent. Bumping before the copy makes any older reference to this slot fail the
            # reader's check before its bytes can change.
            gen = region.gens[slot] + 1
            region.set_generation(slot, gen)
            offset = region.slot_offset(slot)
            region.buf[offset : offset + view.nbytes] = view
            self._lent[(index, slot)] = (stream, gen)
            self._by_stream.setdefault(stream, set()).add((index, slot))
        return ShmRef(region=region.name, offset=offset, length=view.nbytes, generation=gen, slot=slot)

    def _take_slot(self, size: int) -> tuple[int, int]:
        for index in self._by_class.get(size, ()):
            if self._regions[index].free:
                return index, self._regions[index].free.pop()
        index = self._add_region(size)
        return index, self._regions[index].free.pop()

    def _add_region(self, size: int) -> int:
        if region_data_offset(1) + size + PAGE > self._max_total:
            raise _NoRoom(FALLBACK_OVERSIZE)
        room = self._max_total - self._mapped
        count = max(1, self._region_bytes // size)
        while count > 0 and region_data_offset(count) + count * size > room:
            count //= 2
        if count == 0:
            raise _NoRoom(FALLBACK_CAPACITY)
        index = len(self._regions)
        try:
            region = create_region(
                self._dir,
                f"{self.prefix}-r{index - 1}",
                kind=KIND_SLAB,
                slot_size=size,
                slot_count=count,
                token=self._token,
                mode=self._mode,
            )
        except NoSpace as exc:
            raise _NoRoom(FALLBACK_NO_SPACE) from exc
        self._regions.append(region)
        self._by_class.setdefault(size, []).append(index)
        self._mapped += region.size
        return index

    def _release(self, ref: ShmRef, stream: int) -> None:
        parsed = parse_region_name(ref.region)
        if parsed is None or parsed.owner_prefix != self.prefix or not parsed.part.startswith("r"):
            raise UnknownShmAck(f"ack for region {ref.region!r}, not owned by this writer ({self.prefix})")
        key = (int(parsed.part[1:]) + 1, ref.slot)
        with self._lock:
            if self._lent.get(key) != (stream, ref.generation):
                raise UnknownShmAck(
                    f"ack for {ref.region} slot {ref.slot} generation {ref.generation}, which is not lent on "
                    "this stream (acked twice, or never sent here)"
                )
            self._free(key)

    def _reclaim(self, stream: int) -> int:
        with self._lock:
            keys = self._by_stream.get(stream, set()).copy()
            for key in keys:
                self._free(key)
            return len(keys)

    def _free(self, key: tuple[int, int]) -> None:
        stream, gen = self._lent.pop(key)
        loans = self._by_stream[stream]
        loans.discard(key)
        if not loans:
            del self._by_stream[stream]
        region = self._regions[key[0]]
        region.set_generation(key[1], gen + 1)  # even = free; references to the old loan are now stale
        region.free.append(key[1])

    def _lent_on(self, stream: int) -> int:
        with self._lock:
            return len(self._by_stream.get(stream, ()))


class ShmSender:
    """One stream's side of the writer: places payloads for one peer, frees on ack, reclaims on close."""

    def __init__(self, writer: ShmWriter, stream: int, peer_readable: bool) -> None:
        self._writer = writer
        self._stream = stream
        self.peer_readable = peer_readable
        self._closed = False

    def place(self, data: Bytes) -> bytes | ShmRef:
        """The payload itself (inline) or a reference to a freshly written slot (shm)."""
        if self._closed:
            raise ShmError("place() on a closed ShmSender")
        return self._writer._place(data, self._stream, self.peer_readable)

    def ack(self, refs: Iterable[ShmRef]) -> None:
        """Frees the slots the peer copied out; raises UnknownShmAck for a slot not lent on this stream."""
        for ref in refs:
            self._writer._release(ref, self._stream)

    @property
    def lent(self) -> int:
        """Slots lent on this stream and not yet acked."""
        return self._writer._lent_on(self._stream)

    def close(self) -> int:
        """The stream ended or broke: takes back every slot still lent on it; returns how many."""
        self._closed = True
        return 0 if self._writer.closed else self._writer._reclaim(self._stream)

    def __enter__(self) -> ShmSender:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
