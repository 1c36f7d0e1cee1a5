"""Opt-in torch.profiler windows in a stage process, on the host's wall clock (the timelines of issues 27/28).

``VOXSTAGE_TORCH_PROFILE=<dir>`` in a talker's or codec's environment arms it (``voxstage serve`` passes its
environment to the stages). Unset, nothing here runs. Armed, the stage's engine thread looks between ticks
(every ``POLL_S``) for ``<dir>/window.json``::

    {"id": 3, "start_unix_s": 1796192254.5, "duration_s": 2.0, "stack": false}

and, at ``start_unix_s``, profiles for ``duration_s``: CPU ops (every thread where the installed torch can,
the engine thread always, since the profiler starts on it) and, on a GPU, the kernels, memcpys and CUDA
runtime calls. Every tick in the window is wrapped in a ``voxstage.tick <thread>`` range, and the window
opens and closes with ``voxstage.clock <unix ns>`` markers that carry ``time.time_ns()``: the reader maps
each trace onto the wall clock with them, so traces of several processes share one clock. ``stack: true``
adds Python stacks (slower ticks: use it to read where Python time goes, not to time it). A window file's
``id`` is profiled once; one written with both stages reading it gives the same window in both.

Written per window: ``<role>-<pid>-w<id>.trace.json`` (Chrome trace) and ``<role>-<pid>-w<id>.meta.json``:
the wall window, the process's CPU seconds (all threads) and the engine thread's over it, and the deltas of
this process's audio and tick counters. Exporting runs on the engine thread after the window (a stall of
up to seconds after it; the window itself is not disturbed). ``bench/timeline.py`` reads both.

``prepare`` starts and stops a profiler once at start-up, before the model is built: the first start in a
process is slow (Kineto's initialization), and on a GPU it starts CUPTI before the stage captures its CUDA
graphs.
"""

from __future__ import annotations

import json
import logging
import os
import resource
import time
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

ENV = "VOXSTAGE_TORCH_PROFILE"
WINDOW_FILE = "window.json"
POLL_S = 0.2
TICK_RANGE = "voxstage.tick"
CLOCK_RANGE = "voxstage.clock"
MAX_WINDOW_S = 60.0  # a trace of a loaded stack grows by megabytes a second: refuse what cannot be read

# The armed capture of this process, if any: the engine thread asks it between ticks.
CAPTURE: Capture | None = None


class _NoScope:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


NO_SCOPE = _NoScope()


def arm(role: str, env: dict[str, str] | None = None) -> Capture | None:
    """Arm this stage process if ``VOXSTAGE_TORCH_PROFILE`` names a folder (touches neither torch nor the
    device: a stage's MPS share must be set before anything starts CUDA)."""
    global CAPTURE
    folder = (env if env is not None else os.environ).get(ENV, "").strip()
    if not folder:
        return None
    CAPTURE = Capture(Path(folder), role)
    log.info("%s: torch profiler armed: windows from %s", role, CAPTURE.window_path)
    return CAPTURE


def prepare(device: str) -> None:
    """When armed: start and stop a profiler once, on the main thread, once the device is chosen and before
    the model is built. The first start in a process initializes Kineto (1.5-2.5 s measured on CPU; it must
    run on the thread that registered it), and on a GPU it starts CUPTI before the stage captures its CUDA
    graphs: kernels replayed from graphs captured earlier are missing from traces on some stacks."""
    if CAPTURE is None:
        return
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if device == "cuda":
        from torch.profiler import _utils

        _utils._init_for_cuda_graphs()
        activities.append(ProfilerActivity.CUDA)
    prof = profile(activities=activities)
    prof.start()
    prof.stop()


def _experimental_config() -> Any:
    """Every thread's ops and no Python event objects at stop, where this torch has those options."""
    from torch.profiler import _ExperimentalConfig

    for options in ({"profile_all_threads": True, "trace_only": True}, {"profile_all_threads": True}, {}):
        try:
            return _ExperimentalConfig(**options)
        except TypeError:
            continue
    return None


def _counters() -> dict[str, float]:
    from voxstage.metrics import REGISTRY

    out: dict[str, float] = {}
    for metric in REGISTRY.collect():
        for sample in metric.samples:
            if sample.name in (
                "voxstage_audio_generated_seconds_total",
                "voxstage_stage_tick_seconds_count",
                "voxstage_stage_tick_seconds_sum",
            ):
                out[sample.name] = out.get(sample.name, 0.0) + sample.value
    return out


def _snapshot() -> dict[str, Any]:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return {
        "unix_ns": time.time_ns(),
        "process_cpu_s": usage.ru_utime + usage.ru_stime,
        "thread_cpu_s": time.thread_time(),  # the engine thread: the caller
        "counters": _counters(),
    }


class Capture:
    def __init__(self, folder: Path, role: str) -> None:
        self.folder = folder
        self.role = role
        self.window_path = folder / WINDOW_FILE
        self.recording = False
        self._next_poll = 0.0
        self._mtime_ns = -1
        self._done: set[int] = set()
        self._window: dict[str, Any] | None = None
        self._prof: Any = None
        self._before: dict[str, Any] = {}
        self._thread = ""

    def poll(self) -> None:
        """Called by the engine thread between ticks: start or end a window when it is due."""
        now = time.time()
        if self._prof is not None:
            if now >= self._window["end"]:  # type: ignore[index]
                self._finish()
            return
        if self._window is None:
            if now < self._next_poll:
                return
            self._next_poll = now + POLL_S
            self._window = self._read()
        if self._window is not None and now >= self._window["start_unix_s"]:
            self._begin()

    def tick(self, thread: str) -> Any:
        """The range around one tick while a window records (a no-op scope otherwise)."""
        if not self.recording:
            return NO_SCOPE
        from torch.profiler import record_function

        return record_function(f"{TICK_RANGE} {thread}")

    def _read(self) -> dict[str, Any] | None:
        try:
            stat = self.window_path.stat()
            if stat.st_mtime_ns == self._mtime_ns:
                return None
            self._mtime_ns = stat.st_mtime_ns
            spec = json.loads(self.window_path.read_text())
            wid, start, duration = int(spec["id"]), float(spec["start_unix_s"]), float(spec["duration_s"])
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("%s: torch profiler: unreadable %s: %s", self.role, self.window_path, exc)
            return None
        if wid in self._done or not 0 < duration <= MAX_WINDOW_S or start + duration < time.time():
            if wid not in self._done:
                log.warning("%s: torch profiler: window %d skipped (past, or not 0 < %.1f s <= %.0f s)",
                            self.role, wid, duration, MAX_WINDOW_S)  # fmt: skip
                self._done.add(wid)
            return None
        return {"id": wid, "start_unix_s": start, "end": start + duration, "stack": bool(spec.get("stack"))}

    def _begin(self) -> None:
        import threading

        import torch
        from torch.profiler import ProfilerActivity, profile, record_function

        assert self._window is not None
        activities = [ProfilerActivity.CPU]
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            activities.append(ProfilerActivity.CUDA)
        self._thread = threading.current_thread().name
        stack, config = self._window["stack"], _experimental_config()
        self._prof = profile(activities=activities, with_stack=stack, experimental_config=config)
        self._prof.start()
        self.recording = True
        self._before = _snapshot()  # after the start: the counters cover what the trace holds
        with record_function(f"{CLOCK_RANGE} {time.time_ns()}"):
            pass
        log.info("%s: torch profiler: window %d started", self.role, self._window["id"])

    def _finish(self) -> None:
        from torch.profiler import record_function

        assert self._window is not None
        window, self._window = self._window, None
        with record_function(f"{CLOCK_RANGE} {time.time_ns()}"):
            pass
        self.recording = False
        after = _snapshot()
        prof, self._prof = self._prof, None
        self._done.add(window["id"])
        stem = self.folder / f"{self.role}-{os.getpid()}-w{window['id']}"
        try:
            prof.stop()
            prof.export_chrome_trace(str(stem) + ".trace.json")
        except Exception:  # noqa: BLE001 - a failed export loses the window, never the stage
            log.exception("%s: torch profiler: window %d not written", self.role, window["id"])
            return
        before = self._before
        meta = {
            "role": self.role,
            "pid": os.getpid(),
            "window_id": window["id"],
            "engine_thread": self._thread,
            "asked": {"start_unix_s": window["start_unix_s"], "end_unix_s": window["end"]},
            "start_unix_ns": before["unix_ns"],
            "end_unix_ns": after["unix_ns"],
            "process_cpu_s": after["process_cpu_s"] - before["process_cpu_s"],
            "engine_thread_cpu_s": after["thread_cpu_s"] - before["thread_cpu_s"],
            "counters": {k: v - before["counters"].get(k, 0.0) for k, v in after["counters"].items()},
            "export_s": (time.time_ns() - after["unix_ns"]) / 1e9,
        }
        Path(str(stem) + ".meta.json").write_text(json.dumps(meta, indent=1) + "\n")
        log.info("%s: torch profiler: window %d written to %s", self.role, window["id"], stem)
