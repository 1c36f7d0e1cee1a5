"""``bench/run_gpu.py``'s phases for issues 27 and 28: ``realtime`` and ``timeline``.

* ``realtime`` (a duplex family's presets): ``bench.realtime_loadgen``'s levels through the
  ``/v1/realtime`` WebSocket with the official ``openai`` client (``--realtime-levels``,
  ``--realtime-seconds`` each, ``--client-procs`` client processes), on a stack started for the top level.
  Writes
  ``realtime_<tag>.json`` and ``realtime_<tag>/`` (stack log, Prometheus snapshots).
* ``timeline``: a stack with ``VOXSTAGE_TORCH_PROFILE`` set (``voxstage.stage.torch_profile``) loaded at
  ``--timeline-load`` (duplex: that many realtime sessions; TTS: that many closed-loop gRPC streams of
  ``--frames`` frames); after ``--timeline-warmup-s`` both stages profile the same ``--timeline-window-s``
  window; then ``bench.timeline`` renders ``timeline_<tag>_<duplex|tts><N>.png`` and ``.json`` (one loaded
  tick per stage on one clock; GPU-ms and CPU-ms per audio second). The gzipped traces stay in
  ``timeline_<tag>_<kind><N>/``. Per-process CPU and GPU busy during the load are in the JSON's ``load``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import threading
import time
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench import loadgen
from bench.duplex_levels import Clients, SessionOptions, level_stack, run_levels
from bench.procsample import Sampler, format_groups
from bench.prom import parse_prom
from bench.stack import REPO, Stack
from bench.timeline import compress, render_window, wait_for_traces, write_window
from voxstage.config.loader import load_deploy_config
from voxstage.stage.torch_profile import POLL_S

if TYPE_CHECKING:
    from bench.run_gpu import Family

PHASES = ("realtime", "timeline")
PROFILE_ENV = "VOXSTAGE_TORCH_PROFILE"  # voxstage.stage.torch_profile.ENV
START_TIMEOUT_S = 120.0  # sessions joining (client processes import, connect, prefill)
# The stream timeouts of a profiled stack: at least a window's trace export (EXPORT_TIMEOUT_S bounds it).
PROFILED_STREAM_TIMEOUT_S = 60.0
EXPORT_TIMEOUT_S = 300.0  # a loaded GPU window's trace takes seconds to write; both stages write theirs


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--realtime-levels", default="32,64", help="realtime: sessions per level")
    ap.add_argument("--realtime-seconds", type=float, default=60.0, help="realtime: seconds per level")
    ap.add_argument("--client-procs", type=int, default=4, help="realtime/timeline: client processes")
    ap.add_argument(
        "--join-spread-s", type=float, default=None, help="realtime: a level's sessions join over this"
    )
    ap.add_argument("--timeline-load", type=int, default=64, help="timeline: sessions (duplex) or streams")
    ap.add_argument("--timeline-warmup-s", type=float, default=15.0, help="timeline: load before the window")
    ap.add_argument(
        "--timeline-window-s", type=float, default=1.0,
        help="timeline: profiled seconds (a loaded TTS talker traces ~10^5 kernels a second)",
    )  # fmt: skip
    ap.add_argument("--timeline-stack", action="store_true", help="timeline: Python stacks in the traces")
    ap.add_argument(
        "--timeline-at-join", action="store_true",
        help="timeline: the window opens with the load (its join burst), not after the warm-up",
    )  # fmt: skip


def phases_for(model: str, fam: Family, phases: list[str]) -> list[str]:
    """The phases that apply to ``model``: a duplex model has no TTS serving, engine or reference phase."""
    if not fam.duplex:
        return phases
    skipped = [p for p in phases if p not in PHASES and p != "report"]
    if skipped:
        print(f"\n== {model}: {','.join(skipped)} skipped: TTS phases; a duplex model is measured by "
              f"realtime and timeline (its frame step: {fam.engine_script.relative_to(REPO)})",
              flush=True)  # fmt: skip
    return [p for p in phases if p not in skipped]


def run(name: str, a: argparse.Namespace, model: str, tag: str, out: Path) -> None:
    from bench.run_gpu import family_of

    phase = {"realtime": realtime_phase, "timeline": timeline_phase}[name]
    phase(a, model, tag, family_of(model), out)


def _duplex_args(
    a: argparse.Namespace, model: str, fam: Family, out: Path, levels: str, seconds: float
) -> argparse.Namespace:
    return argparse.Namespace(
        out=out, model=model, device=a.device, levels=levels, seconds=seconds, voice=fam.voice,
        persona=SessionOptions.persona, join_spread_s=a.join_spread_s, client_procs=a.client_procs,
        settle=1.0 if a.profile == "smoke" else 3.0, set=list(a.set), threads=a.threads,
    )  # fmt: skip


def realtime_phase(a: argparse.Namespace, model: str, tag: str, fam: Family, out: Path) -> None:
    if not fam.duplex:
        print(f"\n== realtime {tag}: skipped ({model} is not a duplex model)", flush=True)
        return
    from bench.realtime_loadgen import realtime_session

    args = _duplex_args(a, model, fam, out / f"realtime_{tag}.json", a.realtime_levels, a.realtime_seconds)
    print(f"\n== realtime {tag}: levels {a.realtime_levels}, {a.realtime_seconds:g} s each", flush=True)
    run_levels(args, "bench.realtime_loadgen", realtime_session, "http")


def _load_then_window(
    load: Any, folder: Path, a: argparse.Namespace, started: Any = None
) -> tuple[Any, float]:
    """Run ``load()`` on a thread; once ``started()`` says the load is on (default: at once) and it then ran
    ``--timeline-warmup-s``, ask for the window. Returns the load's result and the window's wall start."""
    result: dict[str, Any] = {}

    def run() -> None:
        try:
            result["value"] = load()
        except BaseException as exc:  # noqa: BLE001 - re-raised on the caller's thread
            result["error"] = exc

    thread = threading.Thread(target=run, name="timeline-load")
    if a.timeline_at_join:
        # The join burst (the first second of a duplex level) is what this window is for: it opens as the
        # load starts; the stages look for it every POLL_S.
        start = time.time() + 2 * POLL_S
        write_window(folder, start, a.timeline_window_s, 1, a.timeline_stack)
        thread.start()
    else:
        thread.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while started is not None and not started() and thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(a.timeline_warmup_s)
        start = time.time() + 0.5
        write_window(folder, start, a.timeline_window_s, 1, a.timeline_stack)
    thread.join()
    if "error" in result:
        raise result["error"]
    return result["value"], start


def _duplex_load(
    a: argparse.Namespace, model: str, fam: Family, stack: Stack, clients: Clients, folder: Path, n: int,
    seconds: float,
) -> tuple[dict[str, Any], float, float]:  # fmt: skip
    """n realtime sessions; the audio they heard in the window is the audio served (the duplex codec does
    not count its output)."""
    from bench.realtime_loadgen import realtime_session

    opts = SessionOptions(voice=fam.voice, model=model)

    def joined() -> bool:  # every session admitted by the gateway: the warm-up counts from here
        return _gauge(stack, "voxstage_duplex_sessions") >= n

    parts, start = _load_then_window(
        lambda: clients.run(realtime_session, stack.http, n, seconds, a.join_spread_s, opts),
        folder,
        a,
        joined,
    )
    records = [r for p in parts for r in p.records.values()]
    mono = start - (time.time() - time.monotonic())  # arrivals are monotonic, the window wall clock
    heard = sum(r.audio_between(mono, mono + a.timeline_window_s) for r in records)
    doc = {"kind": "realtime sessions", "sessions": n, "errors": sum(len(r.errors) for r in records)}
    doc["late_frames"] = sum(r.summary()["late"] for r in records)
    return doc, start, heard / a.timeline_window_s


def profiling_sets(deploy: Path, timeout_s: float = PROFILED_STREAM_TIMEOUT_S) -> list[str]:
    """``--set`` overrides that give every connector of ``deploy`` first-chunk and stall timeouts of at least
    ``timeout_s`` (each is a count of ``connector_get_sleep_s``)."""
    out = []
    for name, connector in load_deploy_config(deploy).connectors.items():
        waits = math.ceil(timeout_s / connector.extra.connector_get_sleep_s)
        for key in ("connector_get_max_wait", "connector_get_max_wait_first_chunk"):
            out.append(f"connectors.{name}.extra.{key}={max(waits, getattr(connector.extra, key))}")
    return out


def _gauge(stack: Stack, name: str) -> float:
    try:
        with urllib.request.urlopen(f"http://{stack.http}/metrics", timeout=2.0) as r:
            return parse_prom(r.read().decode()).get(name, 0.0)
    except OSError:
        return 0.0


def _tts_load(
    a: argparse.Namespace, fam: Family, stack: Stack, folder: Path, n: int, seconds: float
) -> tuple[dict[str, Any], float]:
    """n closed-loop gRPC streams of ``--frames`` frames (``bench.loadgen``, its JSON kept as load.json)."""
    argv = ["--grpc", stack.grpc, "--closed", str(n), "--duration", str(seconds), "--frames", str(a.frames)]
    argv += ["--voice", fam.voice, "--language", fam.language, "--frame-rate-hz", str(fam.frame_rate_hz)]
    argv += ["--out", str(folder / "load.json"), "--settle", "0"]
    _, start = _load_then_window(lambda: loadgen.main(argv), folder, a)
    level = json.loads((folder / "load.json").read_text())["levels"][0]["aggregate"]
    doc: dict[str, Any] = {"kind": "closed-loop gRPC streams", "streams": n, "loadgen": argv}
    doc |= {k: level.get(k) for k in ("requests", "ok", "errors", "underrun_requests")}
    return doc, start


def timeline_phase(a: argparse.Namespace, model: str, tag: str, fam: Family, out: Path) -> None:
    n = a.timeline_load
    name = f"timeline_{tag}_{'duplex' if fam.duplex else 'tts'}{n}"
    folder = out / name
    folder.mkdir(parents=True, exist_ok=True)
    env = {PROFILE_ENV: str(folder)}
    # Each stage writes its window's trace on its engine thread (seconds: `export_s` in the trace's meta), so
    # the stream timeouts are raised for this stack: the measurement's own stall must not end requests.
    sets = profiling_sets(fam.deploy)
    # The load outlasts the window; duplex sessions also join (connect, prefill) before the warm-up counts.
    joining = 5.0 + 0.1 * n if fam.duplex else 0.0
    seconds = joining + a.timeline_warmup_s + a.timeline_window_s + 3.0
    if fam.duplex:
        args = _duplex_args(a, model, fam, out / f"{name}.json", str(n), seconds)
        args.set = [*args.set, *sets]
        stack = level_stack(args, folder, env=env)
    else:
        from bench.serve_gpu import stack_spec

        spec = stack_spec(a, model, fam, max(a.slots, n))
        spec = dataclasses.replace(spec, extra_sets=(*spec.extra_sets, *sets))
        stack = Stack(spec, folder / "stack.log", env=env)
    what = f"{n} {'sessions' if fam.duplex else 'streams'}"
    print(f"\n== timeline {tag}: {what}, {a.timeline_window_s:g} s window after {a.timeline_warmup_s:g} s "
          f"of load; traces in {folder}", flush=True)  # fmt: skip
    if not stack.start():
        raise RuntimeError(f"timeline stack did not start:\n{stack.tail()}")
    clients = Clients(a.client_procs if fam.duplex else 1, preload="bench.realtime_loadgen")
    audio_rate: float | None = None
    try:
        groups = {**stack.process_groups(), "client": clients.pids}
        with Sampler(groups) as sampler:
            if fam.duplex:
                load_doc, start, audio_rate = _duplex_load(a, model, fam, stack, clients, folder, n, seconds)
            else:
                load_doc, start = _tts_load(a, fam, stack, folder, n, seconds)
        traces = wait_for_traces(folder, 1, 2, EXPORT_TIMEOUT_S)
    finally:
        clients.close()
        exit_code = stack.stop()
    summary = render_window(folder, 1, out / name, audio_s_per_s=audio_rate)
    summary["load"] = load_doc | {"seconds": seconds, "window_start_unix_s": start}
    summary["load"]["processes"] = sampler.summary()
    summary["stack"] = {"command": stack.command(), "start_s": stack.start_s, "exit_code": exit_code}
    summary["sample_pids"] = format_groups(groups)
    (out / f"{name}.json").write_text(json.dumps(summary, indent=1) + "\n")
    compress(traces)
    print(f"wrote {out / name}.png / .json ({len(traces)} traces)", flush=True)
