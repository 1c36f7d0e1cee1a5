"""Reader side of the shared-memory fast path: copy-out with generation checks, and reclaiming dead writers.

Regions are attached with ``os.open`` + ``mmap`` (never ``multiprocessing.shared_memory``, whose resource
tracker would unlink a segment the writer still uses when this reader exits: cpython gh-82300).
"""

from __future__ import annotations

import mmap
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from voxstage.transport.shm_layout import (
    DEFAULT_SHM_DIR,
    GEN,
    GEN_TABLE_OFFSET,
    KIND_SLAB,
    TEMP_RE,
    Header,
    InvalidShmReference,
    ShmError,
    ShmRef,
    StaleShmReference,
    owner_alive,
    parse_region_name,
    read_header,
    region_data_offset,
    unlink_if_orphaned,
)

# A hidden probe file younger than this may belong to a writer that is creating it right now.
SWEEP_TEMP_GRACE_S = 60.0


@dataclass
class _Attached:
    fd: int
    buf: mmap.mmap  # read-only
    header: Header


class ShmReader:
    """Copies payloads out of peers' regions; attaches by name without Python's resource tracker."""

    def __init__(self, *, shm_dir: str | Path = DEFAULT_SHM_DIR) -> None:
        self._dir = Path(shm_dir)
        self._maps: dict[str, _Attached] = {}
        self._lock = threading.Lock()

    def read(self, ref: ShmRef) -> bytes:
        """The payload's bytes; StaleShmReference if the slot moved on, InvalidShmReference if malformed."""
        parsed = parse_region_name(ref.region)
        if parsed is None or not parsed.part.startswith("r"):
            raise InvalidShmReference(f"{ref.region!r} is not a voxstage shared-memory region name")
        with self._lock:
            att = self._attach(ref.region, parsed.pid, parsed.token)
            if os.fstat(att.fd).st_nlink == 0:
                self._detach(ref.region)
                raise StaleShmReference(f"{ref.region} was unlinked by its owner or reaped")
            buf, hdr = att.buf, att.header
            if read_header(buf) != hdr:
                self._detach(ref.region)
                raise StaleShmReference(f"{ref.region}: header changed or bad magic")
            if not 0 <= ref.slot < hdr.slot_count:
                raise InvalidShmReference(f"{ref.region}: slot {ref.slot} not in 0..{hdr.slot_count - 1}")
            start = hdr.data_offset + ref.slot * hdr.slot_size
            if ref.offset != start or not 0 <= ref.length <= hdr.slot_size:
                raise InvalidShmReference(
                    f"{ref.region}: offset {ref.offset} / length {ref.length} do not fit slot {ref.slot}"
                )
            gen_at = GEN_TABLE_OFFSET + GEN.size * ref.slot
            before = GEN.unpack_from(buf, gen_at)[0]
            if before != ref.generation or before % 2 == 0:
                raise StaleShmReference(
                    f"{ref.region} slot {ref.slot}: generation is {before}, reference has {ref.generation}"
                )
            data = buf[ref.offset : ref.offset + ref.length]
            after = GEN.unpack_from(buf, gen_at)[0]
            if after != before:
                raise StaleShmReference(f"{ref.region} slot {ref.slot} was reused while being read")
            return data

    def _attach(self, name: str, pid: int, token: str) -> _Attached:
        att = self._maps.get(name)
        if att is not None:
            return att
        try:
            fd = os.open(self._dir / name, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            raise StaleShmReference(f"{name} no longer exists") from None
        except OSError as exc:  # e.g. another user's 0600 file: the handshake should have prevented this
            raise ShmError(f"cannot open shared-memory region {name}: {exc.strerror}") from exc
        try:
            size = os.fstat(fd).st_size
            if size < GEN_TABLE_OFFSET:
                raise StaleShmReference(f"{name}: too short to be a region ({size} bytes)")
            buf = mmap.mmap(fd, size, prot=mmap.PROT_READ)
            hdr = read_header(buf)
            if (
                hdr is None
                or hdr.kind != KIND_SLAB
                or (hdr.owner_pid, hdr.token) != (pid, token)
                or hdr.region_size != size
                or hdr.data_offset < region_data_offset(hdr.slot_count)
                or hdr.data_offset + hdr.slot_count * hdr.slot_size > size
            ):
                buf.close()
                raise StaleShmReference(f"{name}: not a valid region (bad magic or header)")
        except BaseException:
            os.close(fd)
            raise
        att = _Attached(fd, buf, hdr)
        self._maps[name] = att
        return att

    def _detach(self, name: str) -> None:
        att = self._maps.pop(name, None)
        if att is not None:
            att.buf.close()
            os.close(att.fd)

    def prune(self) -> int:
        """Drops mappings of regions that were unlinked (their memory is freed once nobody maps them)."""
        with self._lock:
            gone = [name for name, att in self._maps.items() if os.fstat(att.fd).st_nlink == 0]
            for name in gone:
                self._detach(name)
            return len(gone)

    def reap_peer(self, probe_region: str) -> list[str]:
        """Call when a stream from ``probe_region``'s writer breaks: if that writer is dead, unlinks all of
        its files and returns their names; a live writer's files are left alone (returns [])."""
        parsed = parse_region_name(probe_region)
        if parsed is None or parsed.part != "probe":
            raise InvalidShmReference(f"{probe_region!r} is not a voxstage probe region name")
        removed = _reap_owner(self._dir, parsed.owner_prefix, temp_grace_s=0.0)
        with self._lock:
            for name in [n for n in self._maps if n.startswith(parsed.owner_prefix + "-")]:
                if os.fstat(self._maps[name].fd).st_nlink == 0:
                    self._detach(name)
        return removed

    def close(self) -> None:
        with self._lock:
            for name in list(self._maps):
                self._detach(name)


def _reap_owner(shm_dir: Path, owner_prefix: str, *, temp_grace_s: float) -> list[str]:
    if owner_alive(shm_dir / f"{owner_prefix}-probe"):
        return []
    regions: list[str] = []
    probes: list[str] = []
    now = time.time()
    with os.scandir(shm_dir) as entries:
        for entry in entries:
            parsed = parse_region_name(entry.name)
            if parsed is not None and parsed.owner_prefix == owner_prefix:
                (probes if parsed.part == "probe" else regions).append(entry.name)
            elif (m := TEMP_RE.match(entry.name)) and f"voxstage-{m['pid']}-{m['token']}" == owner_prefix:
                try:
                    age = now - entry.stat().st_mtime
                except FileNotFoundError:
                    continue
                if age >= temp_grace_s:
                    probes.append(entry.name)
    # The probe goes last so that, until the end, other sweepers see this owner as "being reaped", not absent.
    return [name for name in regions + probes if unlink_if_orphaned(shm_dir / name)]


def sweep_dead_regions(
    shm_dir: str | Path = DEFAULT_SHM_DIR, *, temp_grace_s: float = SWEEP_TEMP_GRACE_S
) -> list[str]:
    """Startup sweep: unlinks every voxstage file whose owner is dead; live owners' files are untouched."""
    directory = Path(shm_dir)
    owners: set[str] = set()
    with os.scandir(directory) as entries:
        for entry in entries:
            parsed = parse_region_name(entry.name)
            if parsed is not None:
                owners.add(parsed.owner_prefix)
            elif m := TEMP_RE.match(entry.name):
                owners.add(f"voxstage-{m['pid']}-{m['token']}")
    removed: list[str] = []
    for owner in sorted(owners):
        removed += _reap_owner(directory, owner, temp_grace_s=temp_grace_s)
    return removed
