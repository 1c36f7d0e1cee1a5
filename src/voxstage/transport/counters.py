"""Plain-int transport counters; the metrics module exports them (this module imports no prometheus)."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

PATH_SHM = "shm"
PATH_INLINE = "inline"

# Why a payload that qualified for shared memory went inline instead.
FALLBACK_PROBE_FAILED = "probe_failed"  # same host, but this end cannot open the peer's regions
FALLBACK_CAPACITY = "capacity"  # the writer's regions are full and max_total_bytes forbids another
FALLBACK_NO_SPACE = "no_space"  # /dev/shm itself is full (e.g. a container's default 64 MB)
FALLBACK_OVERSIZE = "oversize"  # one payload is larger than max_total_bytes allows
FALLBACK_REASONS = (FALLBACK_PROBE_FAILED, FALLBACK_CAPACITY, FALLBACK_NO_SPACE, FALLBACK_OVERSIZE)


@dataclass
class TransportCounters:
    """Monotonic counters of payloads sent, by path, and of shared-memory fallbacks, by reason."""

    bytes_by_path: dict[str, int] = field(default_factory=lambda: {PATH_SHM: 0, PATH_INLINE: 0})
    payloads_by_path: dict[str, int] = field(default_factory=lambda: {PATH_SHM: 0, PATH_INLINE: 0})
    fallbacks: dict[str, int] = field(default_factory=lambda: dict.fromkeys(FALLBACK_REASONS, 0))
    # Writers run on the event loop while an engine thread may also publish; += on a dict entry is not atomic.
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def count_payload(self, path: str, nbytes: int) -> None:
        if path not in (PATH_SHM, PATH_INLINE):
            raise ValueError(f"unknown transport path {path!r}; expected {PATH_SHM!r} or {PATH_INLINE!r}")
        with self._lock:
            self.bytes_by_path[path] += nbytes
            self.payloads_by_path[path] += 1

    def count_fallback(self, reason: str) -> None:
        if reason not in FALLBACK_REASONS:
            raise ValueError(f"unknown fallback reason {reason!r}; expected one of {FALLBACK_REASONS}")
        with self._lock:
            self.fallbacks[reason] += 1

    def snapshot(self) -> dict[str, dict[str, int]]:
        """A consistent copy, for exporters and tests."""
        with self._lock:
            return {
                "bytes_by_path": dict(self.bytes_by_path),
                "payloads_by_path": dict(self.payloads_by_path),
                "fallbacks": dict(self.fallbacks),
            }


# The process-wide instance that writers and peer checks use unless given their own.
transport_counters = TransportCounters()
