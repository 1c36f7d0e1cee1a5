"""Per-process CPU and GPU busy, sampled every second while a load level runs (issues 27 and 28).

A stack's throughput can be bound by a process's Python (one core at 100 %) long before the GPU is busy, so
every level records, beside its latencies, each named process's CPU (``/proc/<pid>/stat`` utime + stime,
all threads, as ``top`` counts it: 100 % is one core) and the GPU's busy share (NVML's utilization: the
share of the last sample period in which any kernel ran, the number ``nvidia-smi`` shows). NVML comes from
``nvidia-ml-py`` (``import pynvml``), which the H200 image has; without it, or without a GPU, ``gpu`` is
null with the reason. Where NVML reports per-process samples, each process's SM share is kept too.

    with Sampler({"talker": [pid], "codec": [pid], "gateway": [pid]}) as s:
        ...  # the level
    s.summary()  # {"interval_s", "samples", "processes": {name: {cpu_pct: {mean, p50, p95, max},
    #               cpu_pct_by_thread: {thread: pct over the level} (one-process groups)}}, "gpu"}
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from bench.playback import percentile

CLK_TCK = os.sysconf("SC_CLK_TCK")
STAGE_ROLES = ("talker", "codec", "gateway")


def _stat_fields(pid: int) -> list[str] | None:
    """``/proc/<pid>/stat`` from field 3 on (the command name, field 2, may hold spaces and parentheses)."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return raw[raw.rindex(")") + 2 :].split()


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of every thread of ``pid`` so far; None once it is gone."""
    fields = _stat_fields(pid)
    if fields is None:
        return None
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime, stime (fields 14 and 15 of stat)


def thread_cpu(pid: int) -> dict[str, tuple[float, float]] | None:
    """(user, system) CPU seconds of each thread of ``pid`` by thread name (the main thread is ``main``);
    None once the process is gone."""
    out: dict[str, tuple[float, float]] = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    for tid in tids:
        try:
            raw = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
            name = "main" if tid == str(pid) else Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip()
        except OSError:
            continue  # the thread ended between the listing and the read
        fields = raw[raw.rindex(")") + 2 :].split()
        user, system = out.get(name, (0.0, 0.0))
        out[name] = (user + int(fields[11]) / CLK_TCK, system + int(fields[12]) / CLK_TCK)
    return out


def children(pid: int) -> list[int]:
    """Direct children of ``pid``, by every process's parent id."""
    out: list[int] = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = _stat_fields(int(entry))
            if fields is not None and int(fields[1]) == pid:
                out.append(int(entry))
    return sorted(out)


def cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def stack_processes(launcher_pid: int) -> dict[str, int]:
    """The stage processes a ``voxstage serve`` launcher started, by role (``python -m voxstage talker``);
    a second replica of a role is ``talker-1``, a third ``talker-2``."""
    found: dict[str, int] = {}
    for pid in children(launcher_pid):
        argv = cmdline(pid)
        role = next((a for a in argv if a in STAGE_ROLES), None)
        if role is None:
            continue
        name, k = role, 1
        while name in found:
            name, k = f"{role}-{k}", k + 1
        found[name] = pid
    return found


class _Nvml:
    """NVML handles of the GPUs this host's ``CUDA_VISIBLE_DEVICES`` names (all GPUs when unset)."""

    def __init__(self) -> None:
        import pynvml  # nvidia-ml-py; an ImportError is the caller's "no NVML"

        self.nvml = pynvml
        pynvml.nvmlInit()
        count = pynvml.nvmlDeviceGetCount()
        visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
        indices = [int(x) for x in visible.split(",") if x.strip().isdigit()] or list(range(count))
        self.handles = [(i, pynvml.nvmlDeviceGetHandleByIndex(i)) for i in indices if i < count]
        if not self.handles:
            raise RuntimeError(f"no GPU visible (CUDA_VISIBLE_DEVICES={visible!r}, {count} on the host)")
        self.last_seen = {i: 0 for i, _ in self.handles}

    def busy(self) -> dict[int, float]:
        return {i: float(self.nvml.nvmlDeviceGetUtilizationRates(h).gpu) for i, h in self.handles}

    def per_process(self) -> dict[int, float]:
        """SM share by pid since the last call (not every driver reports it: empty then)."""
        out: dict[int, float] = {}
        for i, h in self.handles:
            try:
                samples = self.nvml.nvmlDeviceGetProcessUtilization(h, self.last_seen[i])
            except self.nvml.NVMLError:
                continue
            for s in samples:
                out[s.pid] = max(out.get(s.pid, 0.0), float(s.smUtil))
                self.last_seen[i] = max(self.last_seen[i], s.timeStamp)
        return out

    def close(self) -> None:
        self.nvml.nvmlShutdown()


def _stats(values: Sequence[float]) -> dict[str, float | None]:
    return {
        "mean": sum(values) / len(values) if values else None,
        "p50": percentile(values, 50),
        "p95": percentile(values, 95),
        "max": max(values, default=None),
    }


_READ_SLACK_S = 0.002  # a read of a few /proc files takes well under this unless interrupted


class Sampler:
    """Samples CPU % of named process groups (a group's pids summed) and GPU busy % on a thread of its own;
    the first sample is taken at ``__enter__``, so even a level shorter than one interval gets one value."""

    def __init__(
        self, groups: Mapping[str, Sequence[int]], interval_s: float = 1.0, gpu: bool = True
    ) -> None:
        self.groups = {name: list(pids) for name, pids in groups.items()}
        self.interval_s = interval_s
        self.cpu: dict[str, list[float]] = {name: [] for name in self.groups}
        self.gpu_busy: dict[int, list[float]] = {}
        self.gpu_sm_by_pid: dict[int, list[float]] = {}
        self.gpu_error: str | None = None
        self._nvml: _Nvml | None = None
        self._want_gpu = gpu
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="procsample", daemon=True)
        self._last: dict[str, tuple[float, float]] = {}
        self._before_last: dict[str, tuple[float, float]] = {}
        # Each one-process group's threads at the start and the end: the engine thread ("talker-engine",
        # "codec-engine", named for the OS by the stages), the event loop ("main") and gRPC's own.
        self._threads_at: list[dict[str, dict[str, tuple[float, float]]]] = []
        self.wall_s = 0.0
        self._t0 = 0.0

    def _cpu_total(self, pids: Sequence[int]) -> float | None:
        values = [cpu_seconds(p) for p in pids]
        present = [v for v in values if v is not None]
        return sum(present) if present else None

    def _read_group(self, pids: Sequence[int]) -> tuple[float, float | None]:
        """(when, CPU seconds) of a group. A read that the scheduler interrupted (this thread descheduled on
        a loaded machine) would pair CPU with the wrong time, so it is taken again, up to three times."""
        for _ in range(3):
            t0 = time.monotonic()
            total = self._cpu_total(pids)
            t1 = time.monotonic()
            if t1 - t0 < _READ_SLACK_S:
                break
        return (t0 + t1) / 2, total

    def _sample(self, tail: bool = False) -> None:
        for name, pids in self.groups.items():
            now, total = self._read_group(pids)
            if total is None:
                continue
            if name in self._last:
                t, c = self._last[name]
                # /proc counts CPU in 10 ms ticks: a tail shorter than an interval would be mostly
                # rounding (one tick in 50 ms reads 20 %), so it is folded into the interval before it.
                if tail and now - t < self.interval_s and name in self._before_last and self.cpu[name]:
                    t, c = self._before_last[name]
                    self.cpu[name].pop()
                if now > t:
                    self.cpu[name].append(100.0 * (total - c) / (now - t))
                self._before_last[name] = (t, c)
            self._last[name] = (now, total)
        if self._nvml is not None:
            try:
                for i, v in self._nvml.busy().items():
                    self.gpu_busy.setdefault(i, []).append(v)
                for pid, v in self._nvml.per_process().items():
                    self.gpu_sm_by_pid.setdefault(pid, []).append(v)
            except Exception as exc:  # noqa: BLE001 - a failing NVML read must not end the level
                self.gpu_error = f"{type(exc).__name__}: {exc}"
                self._nvml = None

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()

    def __enter__(self) -> Sampler:
        if self._want_gpu:
            try:
                self._nvml = _Nvml()
            except Exception as exc:  # noqa: BLE001 - no NVML, no driver, no GPU: gpu is null, with why
                self.gpu_error = f"{type(exc).__name__}: {exc}"
        else:
            self.gpu_error = "not sampled"
        self._t0 = time.monotonic()
        self._sample()
        self._read_threads()
        self._thread.start()
        return self

    def _read_threads(self) -> None:
        self._threads_at.append(
            {name: thread_cpu(pids[0]) or {} for name, pids in self.groups.items() if len(pids) == 1}
        )

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample(tail=True)  # the tail since the last tick
        self._read_threads()
        self.wall_s = time.monotonic() - self._t0
        if self._nvml is not None:
            self._nvml.close()

    def summary(self) -> dict[str, Any]:
        processes: dict[str, Any] = {}
        for name, pids in self.groups.items():
            entry: dict[str, Any] = {"pids": pids, "cpu_pct": _stats(self.cpu[name])}
            sm = [v for p in pids for v in self.gpu_sm_by_pid.get(p, [])]
            entry["gpu_sm_pct"] = _stats(sm) if sm else None
            if len(self._threads_at) == 2 and self.wall_s > 0 and name in self._threads_at[0]:
                first, last = self._threads_at[0][name], self._threads_at[1].get(name, {})
                entry["cpu_pct_by_thread"] = {
                    thread: round(100.0 * (u + st - sum(first.get(thread, (0.0, 0.0)))) / self.wall_s, 2)
                    for thread, (u, st) in sorted(last.items())
                }
            processes[name] = entry
        gpu: dict[str, Any] | None = None
        if self.gpu_busy:
            gpu = {"busy_pct": {str(i): _stats(v) for i, v in self.gpu_busy.items()}}
            gpu["error"] = self.gpu_error
        return {
            "interval_s": self.interval_s,
            "wall_s": self.wall_s,
            "samples": max((len(v) for v in self.cpu.values()), default=0),
            "processes": processes,
            "gpu": gpu,
            "gpu_unavailable": None if gpu else self.gpu_error,
        }


def parse_groups(text: str) -> dict[str, list[int]]:
    """``talker=123,codec=456,client=7+8`` (a group's pids joined with ``+``) -> groups for ``Sampler``."""
    groups: dict[str, list[int]] = {}
    for item in (x for x in text.split(",") if x.strip()):
        name, sep, pids = item.partition("=")
        if not sep or not name.strip():
            raise ValueError(f"{item!r}: expected NAME=PID[+PID...]")
        groups[name.strip()] = [int(p) for p in pids.split("+")]
    return groups


def format_groups(groups: Mapping[str, Sequence[int]]) -> str:
    return ",".join(f"{name}={'+'.join(str(p) for p in pids)}" for name, pids in groups.items())
