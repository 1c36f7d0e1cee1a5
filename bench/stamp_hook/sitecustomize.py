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

Inside the talker's engine (its thread; ``ENGINE_POINTS``, between ``talker.submit`` and ``talker.output``):
the engine takes the submit, has prepared the prompt, admits the request into a slot, launches its prefill,
has launched its first frame step, and begins collecting it. Host times: the kernels run later, so a wait
for the GPU shows in the last hop, ``talker.collect -> talker.output``. The engine knows a request by its
take's key (``<stream key>.<take>``): the talker's submit writes ``ALIAS <take key> <request id>`` first.
"""

from __future__ import annotations

import cProfile
import functools
import importlib.abc
import importlib.util
import inspect
import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

POINTS = (
    "gateway.open", "codec.open", "codec.relay_open", "talker.open", "talker.text", "talker.submit",
    "talker.output", "talker.send", "codec.frames", "codec.pcm", "gateway.pcm",
)  # fmt: skip
ENGINE_POINTS = (
    "talker.engine", "talker.prepared", "talker.admit", "talker.prefill", "talker.launch", "talker.collect",
)  # fmt: skip
Rid = Callable[[Any, tuple[Any, ...]], str]
Rids = Callable[[tuple[Any, ...]], list[str]]


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


def _patch_engine(cls: type, name: str, point: str, rids: Rids, after: bool = False) -> None:
    """Stamp ``point`` on entry to ``cls.name`` (with ``after``: on its return, ``rids`` then reading the
    result) for each request its arguments name, the first time only."""
    orig = getattr(cls, name)
    seen: set[str] = set()

    def mark(names: list[str]) -> None:
        for rid in names:
            if rid not in seen:
                seen.add(rid)
                _stamp(point, rid)

    @functools.wraps(orig)
    def wrapped(self: Any, *a: Any, **k: Any) -> Any:
        if not after:
            mark(rids(a))
            return orig(self, *a, **k)
        out = orig(self, *a, **k)
        mark(rids((out,)))
        return out

    setattr(cls, name, wrapped)


def _seq_rids(seqs: Any) -> list[str]:
    return [str(s.request.request_id) for s in seqs if s is not None]


def _time_prepare(engine_cls: type, out_dir: str) -> None:
    """With ``VX_PREPARE_OUT`` set: each ``prepare`` of the engine's adapter timed on the engine thread, wall
    clock against the thread's own CPU time (a gap is time the thread waited: the GIL, the scheduler),
    written to ``<VX_PREPARE_OUT>/prepare_<pid>.json`` every 8 calls."""
    samples: list[tuple[float, float]] = []
    submit = engine_cls.submit
    # With VX_PREPARE_PROFILE set too, each prepare also runs under cProfile (which slows it), its stats
    # accumulated in prepare_<pid>.prof: where a served prepare's CPU time goes, function by function.
    profile = cProfile.Profile() if os.environ.get("VX_PREPARE_PROFILE") else None

    def timed_prepare(prepare: Callable[[Any], Any]) -> Callable[[Any], Any]:
        def timed(spec: Any) -> Any:
            t0, c0 = time.perf_counter(), time.thread_time()
            if profile is not None:
                profile.enable()
            try:
                return prepare(spec)
            finally:
                if profile is not None:
                    profile.disable()
                samples.append((time.perf_counter() - t0, time.thread_time() - c0))
                if len(samples) % 8 == 0:
                    base = os.path.join(out_dir, f"prepare_{os.getpid()}")
                    doc = {"wall_s": [w for w, _ in samples], "cpu_s": [c for _, c in samples]}
                    with open(f"{base}.json", "w") as f:
                        json.dump(doc, f)
                    if profile is not None:
                        profile.dump_stats(f"{base}.prof")

        return timed

    @functools.wraps(submit)
    def wrapped(self: Any, *a: Any, **k: Any) -> Any:
        if not getattr(self.adapter, "_prepare_timed", False):
            self.adapter._prepare_timed = True
            self.adapter.prepare = timed_prepare(self.adapter.prepare)
        return submit(self, *a, **k)

    engine_cls.submit = wrapped


def _talker_engine(m: Any) -> None:
    e = m.TalkerEngine
    if out_dir := os.environ.get("VX_PREPARE_OUT"):
        _time_prepare(e, out_dir)
    _patch_engine(e, "submit", "talker.engine", lambda a: [str(a[0].request_id)])
    _patch_engine(e, "_check_fits", "talker.prepared", lambda a: _seq_rids(a[:1]))
    _patch_engine(e, "_feed_text", "talker.admit", lambda a: _seq_rids(a[:1]))
    _patch_engine(e, "_prefill_chunks", "talker.prefill", lambda a: _seq_rids(a[0]))
    _patch_engine(e, "_launch", "talker.launch", lambda a: _seq_rids(a[0][1]) if a[0] else [], after=True)
    _patch_engine(e, "_collect", "talker.collect", lambda a: _seq_rids(a[0][1]))


def _gateway(m: Any) -> None:
    _patch(m.CodecStream, "open", "gateway.open", _opened, once=False)
    _patch(m.CodecStream, "_pcm", "gateway.pcm")


def _codec_stream(m: Any) -> None:
    _patch(m.CodecStream, "_open", "codec.open", _opened, once=False)
    _patch(m.CodecStream, "frames_in", "codec.frames")
    _patch(m.CodecStream, "on_pcm", "codec.pcm")


def _codec_relay(m: Any) -> None:
    _patch(m.TalkerRelay, "open", "codec.relay_open", _opened, once=False)


def _alias_takes(cls: type) -> None:
    """The engine's name of each take a stream starts (``TalkerStream._start`` names it so), as an alias."""
    orig = cls._start

    @functools.wraps(orig)
    async def wrapped(self: Any, *a: Any, **k: Any) -> Any:
        rid = _own(self, a)
        if rid:
            sys.stderr.write(f"ALIAS {self.key}.{len(self.by_key)} {rid}\n")
        return await orig(self, *a, **k)

    cls._start = wrapped


def _talker(m: Any) -> None:
    _alias_takes(m.TalkerStream)
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
    "services.talker.engine": _talker_engine,
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
