"""Same-host detection for the shared-memory fast path.

Both ends of a stream exchange a ``Hello`` (``TransportHello`` on the wire). Shared memory from A to B is used
only when B opened and validated A's probe region; B says so by echoing the probe's name in its own hello
(``verified_peer_probe``) and A checks the echo with ``ShmWriter.peer_can_read``.

The boot id, not the host name, decides "same host": containers on one machine have different host names but
one kernel. Same kernel is still not enough (containers without a shared IPC namespace or /dev/shm mount see
different files), which is what the probe settles; that case is counted as a ``probe_failed`` fallback.
"""

from __future__ import annotations

import mmap
import os
import socket
from dataclasses import dataclass
from pathlib import Path

from voxstage.transport.counters import FALLBACK_PROBE_FAILED, TransportCounters, transport_counters
from voxstage.transport.shm_layout import (
    DEFAULT_SHM_DIR,
    GEN_TABLE_OFFSET,
    KIND_PROBE,
    owner_alive,
    parse_region_name,
    read_header,
)

BOOT_ID_PATH = Path("/proc/sys/kernel/random/boot_id")


@dataclass(frozen=True, slots=True)
class Hello:
    """One end's transport identity: mirrors ``voxstage.internal.v1.TransportHello``."""

    boot_id: str
    hostname: str
    pid: int
    # This end's probe region; empty when it never writes shared memory.
    probe_region: str = ""
    shm_threshold_bytes: int = 0
    # The peer's probe that this end validated; empty when none.
    verified_peer_probe: str = ""


def boot_id(path: Path = BOOT_ID_PATH) -> str:
    """The kernel's boot id, or "" where there is none (then no peer is ever judged same-host)."""
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def local_hello(
    *, probe_region: str = "", shm_threshold_bytes: int = 0, verified_peer_probe: str = ""
) -> Hello:
    return Hello(
        boot_id=boot_id(),
        hostname=socket.gethostname(),
        pid=os.getpid(),
        probe_region=probe_region,
        shm_threshold_bytes=shm_threshold_bytes,
        verified_peer_probe=verified_peer_probe,
    )


def probe_readable(probe_region: str, *, shm_dir: str | Path = DEFAULT_SHM_DIR) -> bool:
    """True if this process can open ``probe_region``, it is a voxstage probe, and its owner is alive."""
    parsed = parse_region_name(probe_region)
    if parsed is None or parsed.part != "probe":
        return False
    path = Path(shm_dir) / probe_region
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:  # missing, or another user's file: either way we cannot read its regions
        return False
    try:
        if os.fstat(fd).st_size < GEN_TABLE_OFFSET:
            return False
        with mmap.mmap(fd, GEN_TABLE_OFFSET, prot=mmap.PROT_READ) as buf:
            header = read_header(buf)
    except OSError:
        return False
    finally:
        os.close(fd)
    if header is None or header.kind != KIND_PROBE:
        return False
    if (header.owner_pid, header.token) != (parsed.pid, parsed.token):
        return False
    return owner_alive(path) is True


def verify_peer(
    peer: Hello,
    *,
    local_boot_id: str | None = None,
    shm_dir: str | Path = DEFAULT_SHM_DIR,
    counters: TransportCounters | None = None,
) -> str:
    """Decides whether the peer may send this process shared-memory references.

    Returns the peer's probe name to echo as ``verified_peer_probe``, or "" when everything from the peer
    must come inline: the peer writes no shm, is on another host, or (counted as a fallback) is on this host
    but its regions cannot be opened from here.
    """
    if not peer.probe_region:
        return ""
    mine = boot_id() if local_boot_id is None else local_boot_id
    if not mine or peer.boot_id != mine:
        return ""
    if probe_readable(peer.probe_region, shm_dir=shm_dir):
        return peer.probe_region
    (counters if counters is not None else transport_counters).count_fallback(FALLBACK_PROBE_FAILED)
    return ""
