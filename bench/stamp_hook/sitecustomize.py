"""Loaded by every process of a stack that a stamping benchmark starts (``bench/open_path.py``,
``bench/voice_library.py --stamps``; this folder is first on ``PYTHONPATH``): writes a
``STAMP <perf_counter> <pid> <point> <request id>`` line to stderr where a text-to-speech request passes a
point on the way to its first audio. ``perf_counter`` is CLOCK_MONOTONIC, one clock for every process of
the host, so the lines of all processes, joined by request id, give each hop of one request. Diagnostics
only: nothing in the product imports it.

Points, in a request's order (``POINTS``): the gateway writes ``open`` to the codec; the codec takes it;
the codec's relay opens the talker (the reference and the engine's stream are ready); the talker takes
the open, its first text, and submits the request to its engine; the engine's first output reaches the
talker's event loop; the talker sends its first frames; the codec takes them; the codec's engine hands out
the first PCM; the gateway takes it. Points after the open are stamped once per request.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.util
import inspect
import os
import sys
import time
from collections.abc import Callable
from typing import Any

POINTS = (
    "gateway.open", "codec.open", "codec.relay_open", "talker.open", "talker.text", "talker.submit",
    "talker.output", "talker.send", "codec.frames", "codec.pcm", "gateway.pcm",
)  # fmt: skip
Rid = Callable[[Any, tuple[Any, ...]], str]


def _stamp(point: str, rid: str) -> None:
    sys.stderr.write(f"STAMP {time.perf_counter():.6f} {os.getpid()} {point} {rid or '-'}\n")


def _own(self: Any, args: tuple[Any, ...]) -> str:
    return str(getattr(self, "request_id", "") or getattr(self, "_stamp_rid", ""))


def _opened(self: Any, args: tuple[Any, ...]) -> str:
    """An open handler's request id (its first argument, a ``StreamOpen``), kept on the object for later
    points of objects that do not keep one (the gateway's upstream)."""
    rid = str(args[0].request_id) if args and hasattr(args[0], "request_id") else ""
    self._stamp_rid = rid
    return rid


def _patch(cls: type, name: str, point: str, rid: Rid = _own, once: bool = True) -> None:
    """Stamp ``point`` on entry to ``cls.name`` (sync or async), once per object unless ``once`` is off."""
    orig = getattr(cls, name)
    flag = f"_stamped_{point.replace('.', '_')}"

    def mark(self: Any, args: tuple[Any, ...]) -> None:
        if once and getattr(self, flag, False):
            return
        if once:
            setattr(self, flag, True)
        _stamp(point, rid(self, args))

    if inspect.iscoroutinefunction(orig):

        @functools.wraps(orig)
        async def wrapped_async(self: Any, *a: Any, **k: Any) -> Any:
            mark(self, a)
            return await orig(self, *a, **k)

        setattr(cls, name, wrapped_async)
    else:

        @functools.wraps(orig)
        def wrapped(self: Any, *a: Any, **k: Any) -> Any:
            mark(self, a)
            return orig(self, *a, **k)

        setattr(cls, name, wrapped)


def _gateway(m: Any) -> None:
    _patch(m.CodecStream, "open", "gateway.open", _opened, once=False)
    _patch(m.CodecStream, "_pcm", "gateway.pcm")


def _codec_stream(m: Any) -> None:
    _patch(m.CodecStream, "_open", "codec.open", _opened, once=False)
    _patch(m.CodecStream, "frames_in", "codec.frames")
    _patch(m.CodecStream, "on_pcm", "codec.pcm")


def _codec_relay(m: Any) -> None:
    _patch(m.TalkerRelay, "open", "codec.relay_open", _opened, once=False)


def _talker(m: Any) -> None:
    _patch(m.TalkerStream, "_open", "talker.open", _opened, once=False)
    _patch(m.TalkerStream, "_text", "talker.text")
    _patch(m.TalkerStream, "_start", "talker.submit")
    _patch(m.TalkerStream, "on_output", "talker.output")
    _patch(m.TalkerStream, "_send_frames", "talker.send")


PATCH: dict[str, Callable[[Any], None]] = {
    "gateway.upstream": _gateway,
    "services.codec.stream": _codec_stream,
    "services.codec.relay": _codec_relay,
    "services.talker.stream": _talker,
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
