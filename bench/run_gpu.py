"""The whole GPU benchmark of one host: serving latency and capacity, engine micro-benchmarks, the reference.

    python -m bench.run_gpu --out OUT [--models PRESET,...] [--profile quick|full]
        [--phases latency,poisson,closed,openai,llm,llm_poisson,engine,reference,report]
        [--ref-env /tmp/refenv] [--pairs 2] [--layout one-gpu,split,pair-per-gpu]

``bench/run_gpu.sh OUT`` installs the carried wheels and runs this (see bench/README.md). Per model:

* ``latency`` / ``poisson`` / ``closed`` run against one ``voxstage serve DEPLOY --model M`` stack (the
  family's seed deploy file; ``--models`` defaults to the presets the families' descriptors name; started
  once for all three; fixed length: EOS disabled for ``--frames`` frames): warm-up, TTFA at 1 req/s Poisson,
  c=1 RTF (gRPC streaming; also the seed file's [1, 25] chunk schedule and the HTTP face), then searches
  for the highest sustained Poisson rate and concurrency (no error, no underrun, p95 TTFA within the SLO);
  ``openai`` measures c=1 and the closed search again through the official ``openai`` client on kept-alive
  HTTP connections; ``llm`` / ``llm_poisson`` repeat them with the text streamed as deltas at an LLM's rate
  (bench/serve_gpu.py); ``--pairs N`` serves from N talker + codec pairs sharing the GPU;
* ``engine``: the family's engine benchmark (its descriptor's ``Bench.engine_script``, in its bench folder
  ``bench/families/<family>/``: frame step and codec time at batch 1/8/32/64);
* ``reference``: the preset's weights exported in the reference's checkpoint layout, then the family's
  reference benchmark (``Bench.reference_export`` and ``Bench.reference_script``, in the same folder) in the
  reference's own environment;
* ``report``: ``summary.json`` / ``summary.md`` with ours-vs-reference ratios, and plots; with layout
  results, ``layouts.json`` / ``layouts.md`` (bench/layout_report.py).

``--layout`` (bench/layouts.py) runs every phase once per named placement of the stages on a multi-GPU
host, each on a stack of its own, files tagged ``<size>_<layout>``.

Every phase writes its JSON as soon as it ends, so a run cut short keeps what it finished and ``--phases``
can resume the rest.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bench import capacity_phases, layouts
from bench.mps import mps_daemon
from bench.serve_gpu import SERVE_PHASES, serve_phases
from bench.stack import REPO
from voxstage import families

ALL_PHASES = (*SERVE_PHASES, *capacity_phases.PHASES, "engine", "reference", "report")
# llm_poisson, realtime and timeline only when asked for.
DEFAULT_PHASES = tuple(p for p in ALL_PHASES if p not in ("llm_poisson", *capacity_phases.PHASES))


@dataclass(frozen=True)
class Family:
    """What the harness needs to know per model family: its seed deploy file and chunk schedule, the request
    defaults its API accepts, its codec frame rate and its engine micro-benchmark."""

    deploy: Path
    seed_schedule: str  # the deploy file's initial_codec_chunk_frames,codec_chunk_frames
    voice: str
    language: str
    frame_rate_hz: float
    engine_script: Path  # the family's engine micro-benchmark, in its bench folder
    reference_script: Path | None  # an official reference implementation the `reference` phase runs
    reference_export: Path | None  # writes a preset's weights in the reference's checkpoint layout
    duplex: bool = False  # a full-duplex model: only the `realtime` and `timeline` phases serve it


def family_of(model: str) -> Family:
    """A preset's bench defaults, from its family's descriptor (``voxstage.families``: ``Family.bench``)."""
    found = families.preset(model)
    bench = None if found is None else found[0].bench
    if found is None or bench is None:
        known = ", ".join(p.name for f in families.families() if f.bench for p in f.presets)
        raise SystemExit(f"--models: {model!r} is not a benchmarked preset ({known})")
    fam, folder = found[0], REPO / bench.folder
    reference = folder / bench.reference_script if bench.reference_script else None
    export = folder / bench.reference_export if bench.reference_export else None
    return Family(
        REPO / fam.deploy_file, bench.schedule, bench.voice, bench.language, fam.frame_rate_hz,
        folder / bench.engine_script, reference, export, fam.duplex,
    )  # fmt: skip


@dataclass(frozen=True)
class Profile:
    ttfa_warmup_s: float
    ttfa_s: float
    c1_requests: int
    level_warmup_s: float
    level_s: float
    rate_start: float
    rate_max: float
    conc_start: float
    conc_max: float
    refine: int
    engine_quick: bool
    ref_runs: int
    # The LLM-rate phases (bench/serve_gpu.py): a request lasts its text (about 7 s at 30 tokens/s), so
    # fewer of them: seconds measured at 1 req/s, c=1 requests, first closed and Poisson search levels.
    llm_ttfa_s: float
    llm_c1_requests: int
    llm_conc_start: float
    llm_rate_start: float


PROFILES = {
    # Nari-like durations (30 s warm-up, 2 min measured at 1 req/s); about an hour for two models.
    "full": Profile(30, 120, 20, 10, 60, 1, 512, 1, 512, 3, False, 5, 120, 10, 4, 1),
    # Sized so one model's serving phases fit a 10-minute device session (bench/README.md); `llm` adds
    # about 2 minutes (20 s at 1 req/s, 3 requests at c=1, closed levels 16, 32, 64).
    "quick": Profile(5, 30, 6, 3, 10, 4, 256, 16, 512, 1, True, 5, 20, 3, 16, 4),
    # CPU dry run of the orchestration on the tiny preset.
    "smoke": Profile(0, 2, 2, 0, 2, 1, 2, 1, 2, 0, True, 1, 2, 1, 1, 1),
}


def size_of(model: str) -> str:
    """The tag of a preset's result files: its name less the family's tag prefix (some keep it whole)."""
    found = families.preset(model)
    bench = None if found is None else found[0].bench
    return model.removeprefix(bench.tag_prefix) if bench and bench.tag_prefix else model


def serve_tag(model: str, pairs: int) -> str:
    """The file tag of a serving run: the size, plus ``_<N>pairs`` for N talker + codec pairs on one GPU."""
    return size_of(model) + (f"_{pairs}pairs" if pairs > 1 else "")


def engine_phase(a: argparse.Namespace, model: str, out: Path, prof: Profile) -> None:
    tag = size_of(model)
    script = family_of(model).engine_script
    cmd = [sys.executable, str(script), "--out", str(out / f"engine_{tag}.json")]
    cmd += ["--size", tag, "--device", a.device, *(["--quick"] if prof.engine_quick else [])]
    cmd += a.engine_args.split()
    print(f"\n== engine {tag}: {' '.join(cmd)}", flush=True)
    with (out / f"engine_{tag}.log").open("wb") as log:
        code = subprocess.run(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT).returncode
    if code != 0:
        raise RuntimeError(f"{script.name} exited {code}; see {out / f'engine_{tag}.log'}")


def reference_phase(a: argparse.Namespace, model: str, out: Path, prof: Profile) -> None:
    tag = size_of(model)
    fam = family_of(model)
    script, exporter = fam.reference_script, fam.reference_export
    if script is None or exporter is None:
        print(f"\n== reference {tag}: skipped (no runnable reference implementation)", flush=True)
        return
    weights = Path(a.scratch) / f"ref-weights-{tag}"
    export = [sys.executable, str(exporter), "--model", model]
    export += ["--out", str(weights), "--device", a.device]
    print(f"\n== reference {tag}: {' '.join(export)}", flush=True)
    log_path = out / f"reference_{tag}.log"
    try:
        with log_path.open("wb") as log:
            if subprocess.run(export, cwd=REPO, stdout=log, stderr=subprocess.STDOUT).returncode != 0:
                raise RuntimeError(f"weight export failed; see {log_path}")
            env = dict(os.environ)
            if a.ref_env:
                env["PYTHONPATH"] = a.ref_env  # the reference's own packages only, never voxstage's
            else:
                env.pop("PYTHONPATH", None)
            cmd = [a.ref_python or sys.executable, str(script)]
            cmd += ["--weights", str(weights), "--out", str(out / f"reference_{tag}.json")]
            cmd += ["--device", a.device, "--frames", str(a.frames), "--runs", str(prof.ref_runs)]
            cmd += ["--decoder-iters", "3"] if a.profile == "smoke" else []
            log.write(f"$ PYTHONPATH={env.get('PYTHONPATH', '')} {' '.join(cmd)}\n".encode())
            log.flush()
            code = subprocess.run(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT).returncode
    finally:
        shutil.rmtree(weights, ignore_errors=True)  # up to 4 GB per model
    if code != 0:
        raise RuntimeError(f"{script.name} exited {code}; see {log_path}")


def worktree_tree(repo: Path) -> str | None:
    """The git tree id of ``repo``'s files as they are (tracked and untracked, not ignored), without touching
    its index: equal to ``git rev-parse <commit>^{tree}`` of the commit whose content ran. It names the code
    even where HEAD does not (a working tree copied onto a machine whose checkout is older)."""
    git_dir = subprocess.run(
        ["git", "rev-parse", "--absolute-git-dir"], cwd=repo, capture_output=True, text=True, timeout=30
    )
    if git_dir.returncode != 0:
        return None
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "GIT_INDEX_FILE": str(Path(tmp) / "index")}
        index = Path(git_dir.stdout.strip()) / "index"
        if index.exists():  # start from the real index: only changed files are hashed again
            shutil.copyfile(index, env["GIT_INDEX_FILE"])
        for cmd in (["git", "add", "-A"], ["git", "write-tree"]):
            done = subprocess.run(cmd, cwd=repo, env=env, capture_output=True, text=True, timeout=300)
            if done.returncode != 0:
                return None
        return done.stdout.strip()


def cuda_device_name() -> str | None:
    """The GPU's name, asked in a child process: under ``--mps`` a CUDA context in this process would be a
    client the daemon's ``quit`` waits for, and this process only sends that quit when the run ends."""
    probe = "import torch; print(torch.cuda.get_device_name() if torch.cuda.is_available() else 'cpu')"
    try:
        done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() or None


def environment(out: Path, device: str, *, mps: bool = False) -> None:
    info: dict[str, object] = {"date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "python": sys.version}
    try:
        info["git_worktree_tree"] = worktree_tree(REPO)
    except (OSError, subprocess.TimeoutExpired):
        info["git_worktree_tree"] = None
    for key, cmd in (
        ("git", ["git", "rev-parse", "HEAD"]),
        # A copied working tree can differ from HEAD (uncommitted or unpushed work): say so.
        ("git_changed_files", ["git", "status", "--porcelain", "--untracked-files=no"]),
        ("nvidia_smi", ["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv"]),
        ("cpus", ["nproc"]),
    ):
        try:
            info[key] = subprocess.run(
                cmd, cwd=REPO, capture_output=True, text=True, timeout=30
            ).stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            info[key] = None
    import torch

    info["torch"] = torch.__version__
    # --mps: the run's own daemon (bench/mps.py); the stages' shares are in serve_<size>.json's command.
    info["mps"] = mps
    info["device"] = cuda_device_name() if device == "cuda" else device
    path = out / "environment.json"
    if not path.exists():
        path.write_text(json.dumps(info, indent=1) + "\n")


def run_layout(
    a: argparse.Namespace,
    layout: layouts.Layout | None,
    models: list[str],
    phases: list[str],
    prof: Profile,
    guarded: Callable[[str, Callable[[], None]], None],
    *,
    unplaced: bool = True,
) -> None:
    """Every model's phases on stacks placed by ``layout`` (None: the deploy file's placement); the phases
    that start no stack (engine, reference) only where ``unplaced`` (once per run, not once per layout)."""
    for model in models:
        fam = family_of(model)
        tag = serve_tag(model, a.pairs) if layout is None else layouts.tag_of(size_of(model), layout)
        name = model if layout is None else f"{model} [{layout.name}]"
        if layout is not None and fam.duplex and not layout.duplex:
            print(f"\n== {name}: skipped (a duplex gateway admits one replica's sessions; "
                  f"layout {layout.name} is for TTS models)", flush=True)  # fmt: skip
            continue
        here = capacity_phases.phases_for(model, fam, phases)  # duplex: realtime, timeline
        if any(p in SERVE_PHASES for p in here):
            guarded(
                f"serve {name}",
                lambda m=model, t=tag: serve_phases(a, m, t, family_of(m), phases, a.out, prof),
            )
        for phase in (p for p in capacity_phases.PHASES if p in here):
            guarded(f"{phase} {name}", lambda n=phase, m=model, t=tag: capacity_phases.run(n, a, m, t, a.out))
        if "engine" in here and unplaced:
            guarded(f"engine {model}", lambda m=model: engine_phase(a, m, a.out, prof))
        if "reference" in here and unplaced:
            guarded(f"reference {model}", lambda m=model: reference_phase(a, m, a.out, prof))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    defaults = [m for f in families.families() if f.bench for m in f.bench.default_models]
    ap.add_argument("--models", default=",".join(defaults))
    ap.add_argument("--phases", default=",".join(DEFAULT_PHASES))
    ap.add_argument("--profile", choices=sorted(PROFILES), default="quick")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--threads", type=int, default=None, help="CPU threads per stage (CPU dry runs)")
    ap.add_argument("--frames", type=int, default=100, help="fixed length of every request (100 = 8 s)")
    ap.add_argument("--slots", type=int, default=64, help="max_num_seqs of both stages (halved if no start)")
    ap.add_argument("--max-model-len", type=int, default=1024, help="talker positions per slot")
    ap.add_argument("--chunk-schedule", default="", help="I,S frames for every request; '' = deploy's")
    ap.add_argument("--ttfa-slo-ms", type=float, default=1000.0)
    ap.add_argument(
        "--closed-start", type=int, default=None,
        help="closed searches (gRPC and openai): the first level, in place of the profile's (e.g. 64 to skip "
        "levels an earlier run passed; the search still steps down from a failing start)",
    )  # fmt: skip
    ap.add_argument("--set", action="append", default=[], help="extra `voxstage serve --set` (repeatable)")
    ap.add_argument(
        "--pairs", type=int, default=1, help="talker + codec pairs sharing the GPU (--slots split over them)"
    )
    ap.add_argument(
        "--pair-memory-fraction",
        type=float,
        default=None,
        help="gpu_memory_utilization of each replica when --pairs > 1 (default 0.9 / (2 x pairs))",
    )
    ap.add_argument("--llm-tokens-per-s", type=float, default=30.0, help="llm phases: text deltas per second")
    ap.add_argument("--llm-search-max", type=int, default=64, help="llm phase: closed search's top level")
    ap.add_argument(
        "--llm-segment-frames", type=int, default=0, help="llm: frames per segment (0: frames / sentences)"
    )
    ap.add_argument(
        "--layout", default="",
        help=f"comma-separated stage placements to run in turn ({', '.join(layouts.LAYOUTS)}; "
        "bench/layouts.py); '' = the deploy file's",
    )  # fmt: skip
    capacity_phases.add_arguments(ap)
    ap.add_argument("--engine-args", default="", help="extra engine_gpu.py arguments, e.g. '--batches 1,64'")
    ap.add_argument("--ref-env", default=None, help="--target folder of the reference's packages")
    ap.add_argument("--ref-python", default=None, help="interpreter for the reference (default: this one)")
    ap.add_argument("--scratch", default="/tmp", help="where exported reference weights go (deleted after)")
    ap.add_argument(
        "--pack", action="store_true",
        help="at the end, pack the run for committing (bench/pack_results.py: logs and Prometheus snapshots "
        "into raw.tar.xz, large per-phase JSON as .json.xz); bench/run_gpu.sh passes it",
    )  # fmt: skip
    ap.add_argument(
        "--mps", action="store_true",
        help="run every phase under a CUDA MPS daemon of its own (stage shares: --set "
        "stages.N.mps_active_thread_percentage=P)",
    )  # fmt: skip
    a = ap.parse_args(argv)
    phases = [p for p in a.phases.split(",") if p]
    unknown = set(phases) - set(ALL_PHASES)
    if unknown:
        raise SystemExit(f"unknown phases {sorted(unknown)}; choose from {', '.join(ALL_PHASES)}")
    if a.pairs < 1:
        raise SystemExit("--pairs must be >= 1")
    chosen = layouts.parse(a.layout)
    if chosen and a.pairs != 1:
        raise SystemExit("--pairs and --layout both place replicas; use one (a layout sets its own pairs)")
    a.pairs_share_device = True
    prof = PROFILES[a.profile]
    a.out.mkdir(parents=True, exist_ok=True)
    models = [m for m in a.models.split(",") if m]
    for model in models:
        family_of(model)  # an unknown model fails here, before any device time is spent
    failures: list[str] = []

    def guarded(name: str, fn: Callable[[], None]) -> None:
        # Device time is scarce: one phase failing must not cost the phases after it.
        try:
            fn()
        except Exception:  # noqa: BLE001 - recorded and reported, the run goes on
            failures.append(f"{name}:\n{traceback.format_exc()}")
            print(f"phase {name} failed:\n{traceback.format_exc()}", flush=True)

    # Everything that touches the GPU runs under the daemon, in child processes: no context outside MPS shares
    # the GPU, and none is left open here when the daemon is told to quit. The report reads files only.
    with mps_daemon(Path(a.scratch) / "vx-mps") if a.mps else contextlib.nullcontext():
        environment(a.out, a.device, mps=a.mps)
        for k, layout in enumerate(chosen or [None]):
            run_layout(layouts.options(a, layout), layout, models, phases, prof, guarded, unplaced=k == 0)
    if "report" in phases:
        from bench.gpu_report import write_report

        def report() -> None:
            write_report(a.out)

        guarded("report", report)
    if failures:
        with (a.out / "failures.log").open("a") as f:
            f.write("\n".join(failures) + "\n")
    if a.pack:
        from bench.pack_results import pack_run

        pack_run(a.out)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
