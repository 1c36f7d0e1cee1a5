"""Loaded by every process of a stack that ``bench/open_path.py`` starts (it is first on ``PYTHONPATH``):
writes a ``STAMP <perf_counter> <pid> <point>`` line to stderr where a request's open and first text pass.
``perf_counter`` is CLOCK_MONOTONIC, one clock for every process of the host. Diagnostics only: nothing in
the product imports it."""

from __future__ import annotations

import functools
import importlib.abc
import importlib.util
import os
import sys
import time
from collections.abc import Callable
from typing import Any


def _stamp(point: str) -> None:
    sys.stderr.write(f"STAMP {time.perf_counter():.6f} {os.getpid()} {point}\n")


def _on_entry(cls: type, name: str, point: str) -> None:
    orig = getattr(cls, name)

    @functools.wraps(orig)
    async def wrapped(self: Any, *a: Any, **k: Any) -> Any:
        _stamp(point)
        return await orig(self, *a, **k)

    setattr(cls, name, wrapped)


PATCH: dict[str, Callable[[Any], None]] = {
    "gateway.upstream": lambda m: _on_entry(m.CodecStream, "open", "gateway.open"),
    "services.talker.stream": lambda m: _on_entry(m.TalkerStream, "_text", "talker.text"),
}


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name not in PATCH:
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
            PATCH[name](module)

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


sys.meta_path.insert(0, _Finder())
