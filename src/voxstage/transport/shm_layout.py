"""On-disk layout of voxstage shared-memory regions: names, header, creation, attachment, liveness.

A region is a file in /dev/shm (POSIX shared memory on Linux is exactly that), created and owned by one
writer process::

    voxstage-<owner pid>-<token>-probe   header only: proves to a peer that it can open this writer's files
    voxstage-<owner pid>-<token>-r<n>    header, generation table, then ``slot_count`` slots of ``slot_size``

Files are opened with ``os.open`` + ``mmap`` instead of ``multiprocessing.shared_memory``: on Python < 3.13
attaching registers the segment with the resource tracker, which unlinks it when the *reader* exits
(cpython gh-82300), and the writer has no use for a tracker process either.

Liveness is an ``flock``: the owner holds ``LOCK_EX`` on every file it created for as long as it lives, and
the kernel drops the lock when the process dies, ``kill -9`` included. "Can I take the lock?" is therefore
"is the owner gone?", with no pid-reuse race and no dependence on sharing a pid namespace with the owner
(containers that share /dev/shm usually do not).
"""

from __future__ import annotations

import errno
import fcntl
import mmap
import os
import re
import struct
from dataclasses import dataclass
from pathlib import Path

DEFAULT_SHM_DIR = Path("/dev/shm")
NAME_PREFIX = "voxstage-"
MAGIC = b"VOXSHM\x00\x01"
LAYOUT_VERSION = 1
KIND_SLAB = 1
KIND_PROBE = 2

# magic, version, kind, owner pid, slot count, slot size, data offset, region size, token (ASCII hex).
HEADER = struct.Struct("<8sIIIIQQQ16s")
GEN_TABLE_OFFSET = 64
GEN = struct.Struct("<Q")
PAGE = mmap.PAGESIZE
TOKEN_CHARS = 16

NAME_RE = re.compile(r"^voxstage-(?P<pid>\d+)-(?P<token>[0-9a-f]{16})-(?P<part>probe|r\d+)$")
# The probe is created under this hidden name and renamed into place once locked (see create_region).
TEMP_RE = re.compile(r"^\.voxstage-(?P<pid>\d+)-(?P<token>[0-9a-f]{16})-probe\.tmp$")


class ShmError(Exception):
    """Base of the shared-memory transport's errors."""


class StaleShmReference(ShmError):
    """The referenced payload is no longer there: slot reused or released, region gone, bad header."""


class InvalidShmReference(ShmError, ValueError):
    """The reference cannot name a voxstage payload at all (bad region name, out-of-bounds offset)."""


@dataclass(frozen=True, slots=True)
class ShmRef:
    """Where a payload lies: mirrors ``voxstage.internal.v1.ShmRef``."""

    region: str
    offset: int
    length: int
    generation: int
    slot: int


@dataclass(frozen=True, slots=True)
class RegionName:
    pid: int
    token: str
    part: str  # "probe" or "r<index>"

    @property
    def owner_prefix(self) -> str:
        return f"{NAME_PREFIX}{self.pid}-{self.token}"


def parse_region_name(name: str) -> RegionName | None:
    """The parts of a voxstage region name, or None for anything else (including path tricks)."""
    m = NAME_RE.match(name)
    if m is None:
        return None
    return RegionName(pid=int(m["pid"]), token=m["token"], part=m["part"])


def region_data_offset(slot_count: int) -> int:
    return _align(GEN_TABLE_OFFSET + GEN.size * slot_count, PAGE)


def _align(n: int, to: int) -> int:
    return (n + to - 1) // to * to


@dataclass
class Header:
    kind: int
    owner_pid: int
    slot_count: int
    slot_size: int
    data_offset: int
    region_size: int
    token: str


def read_header(buf: mmap.mmap) -> Header | None:
    """The header, or None when the bytes are not a voxstage region of this layout version."""
    if len(buf) < GEN_TABLE_OFFSET:
        return None
    magic, version, kind, pid, count, size, data_offset, region_size, token = HEADER.unpack_from(buf, 0)
    if magic != MAGIC or version != LAYOUT_VERSION or kind not in (KIND_SLAB, KIND_PROBE):
        return None
    return Header(kind, pid, count, size, data_offset, region_size, token.decode("ascii", "replace"))


class OwnedRegion:
    """A region this process created: mapped read-write and locked until ``destroy``."""

    def __init__(self, path: Path, fd: int, buf: mmap.mmap, header: Header) -> None:
        self.path = path
        self.name = path.name
        self.fd = fd
        self.buf = buf
        self.header = header
        self.gens = [0] * header.slot_count  # mirror of the table: the writer never reads its own header
        self.free = list(range(header.slot_count - 1, -1, -1))  # pop() hands out slot 0 first

    @property
    def size(self) -> int:
        return self.header.region_size

    def slot_offset(self, slot: int) -> int:
        return self.header.data_offset + slot * self.header.slot_size

    def set_generation(self, slot: int, gen: int) -> None:
        self.gens[slot] = gen
        GEN.pack_into(self.buf, GEN_TABLE_OFFSET + GEN.size * slot, gen)

    def destroy(self, owner_pid: int) -> None:
        """Invalidates outstanding references, unlinks, unmaps; only the creating process unlinks."""
        if self.buf.closed:
            return
        # A forked child inherits this object but not the loans: it must neither touch the shared generation
        # table nor unlink the parent's files, only drop its own mapping.
        if os.getpid() == owner_pid:
            for slot, gen in enumerate(self.gens):
                if gen % 2:  # still lent: make every outstanding reference stale before the name disappears
                    self.set_generation(slot, gen + 1)
            self.path.unlink(missing_ok=True)
        self.buf.close()
        os.close(self.fd)


class NoSpace(ShmError):
    """/dev/shm cannot hold another region (tmpfs full or too small)."""


def create_region(
    shm_dir: Path, name: str, *, kind: int, slot_size: int, slot_count: int, token: str, mode: int
) -> OwnedRegion:
    """Creates, locks, sizes and stamps a region; raises NoSpace when the tmpfs is full."""
    data_offset = region_data_offset(slot_count)
    size = data_offset + slot_size * slot_count if kind == KIND_SLAB else PAGE
    final = shm_dir / name
    # The probe is what tells a sweeper that the owner lives, so it must never be visible unlocked: build it
    # under a hidden name and rename it into place. Slab regions are covered by the already-locked probe.
    path = shm_dir / f".{name}.tmp" if kind == KIND_PROBE else final
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
    buf: mmap.mmap | None = None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        _reserve(fd, size)
        buf = mmap.mmap(fd, size)
        header = Header(kind, os.getpid(), slot_count, slot_size, data_offset, size, token)
        HEADER.pack_into(
            buf,
            0,
            MAGIC,
            LAYOUT_VERSION,
            kind,
            header.owner_pid,
            slot_count,
            slot_size,
            data_offset,
            size,
            token.encode("ascii"),
        )
        if path != final:
            os.rename(path, final)
        return OwnedRegion(final, fd, buf, header)
    except BaseException:
        path.unlink(missing_ok=True)
        if buf is not None:
            buf.close()
        os.close(fd)
        raise


def _reserve(fd: int, size: int) -> None:
    # ftruncate alone leaves tmpfs pages unallocated, and touching them when /dev/shm is full kills the
    # process with SIGBUS; posix_fallocate reserves them now and fails cleanly with ENOSPC instead.
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.ENOMEM, errno.EFBIG):
            raise NoSpace(f"/dev/shm cannot hold {size} more bytes: {exc.strerror}") from exc
        if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
            raise
        os.ftruncate(fd, size)  # filesystem without fallocate support (not tmpfs); no reservation possible


def owner_alive(path: Path) -> bool | None:
    """True if the file's owner still holds its lock, False if not, None if the file does not exist."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # closing drops the lock if we took it
    return False


def unlink_if_orphaned(path: Path) -> bool:
    """Unlinks ``path`` while holding its lock, so a live owner's file is never removed; True if removed."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        try:
            # The name may have been removed and reused between open and lock; only unlink our inode.
            if os.stat(path).st_ino != os.fstat(fd).st_ino:
                return False
            path.unlink()
        except FileNotFoundError:
            return False
        return True
    finally:
        os.close(fd)
