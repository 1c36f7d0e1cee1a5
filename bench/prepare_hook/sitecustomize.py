"""Diagnostics only (a device call puts this folder first on ``PYTHONPATH``; nothing in the product imports
it): in a talker process, times each ``prepare`` of the engine's adapter on the engine thread, wall clock
against the thread's own CPU time (a gap is time the thread waited: the GIL, the scheduler), and writes
the samples to ``$VX_PREPARE_OUT/prepare_<pid>.json`` every 8 calls."""

from __future__ import annotations

import functools
import importlib.abc
import importlib.util
import json
import os
import sys
import time
from typing import Any

_OUT = os.environ.get("VX_PREPARE_OUT", "")
_samples: list[tuple[float, float]] = []


def _wrap_engine(m: Any) -> None:
    submit = m.TalkerEngine.submit

    @functools.wraps(submit)
    def wrapped(self: Any, *a: Any, **k: Any) -> Any:
        ad = self.adapter
        if not getattr(ad, "_prepare_timed", False):
            ad._prepare_timed = True
            prepare = ad.prepare

            def timed(spec: Any) -> Any:
                t0, c0 = time.perf_counter(), time.thread_time()
                try:
                    return prepare(spec)
                finally:
                    _samples.append((time.perf_counter() - t0, time.thread_time() - c0))
                    if _OUT and len(_samples) % 8 == 0:
                        path = os.path.join(_OUT, f"prepare_{os.getpid()}.json")
                        doc = {"wall_s": [w for w, _ in _samples], "cpu_s": [c for _, c in _samples]}
                        with open(path, "w") as f:
                            json.dump(doc, f)

            ad.prepare = timed
        return submit(self, *a, **k)

    m.TalkerEngine.submit = wrapped


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name != "services.talker.engine":
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module: Any) -> None:
            run(module)
            _wrap_engine(module)

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


sys.meta_path.insert(0, _Finder())
