"""``voxstage serve``: one host's deployment as separate processes (talker, codec, gateway), supervised.

Each stage is its own ``python -m voxstage <stage> ...`` process that sees only its stage's ``devices``
(``CUDA_VISIBLE_DEVICES`` narrowed from the launcher's own). The talkers and codecs start together, and the
gateway once all of them report SERVING on gRPC health (a codec dials a talker only when a stream names it, so
it needs none at start-up). A stage that dies at start-up fails the launch naming it. Once everything is up, a
stage that dies is restarted alone, on the same address and flags, after an exponential back-off, while the
others keep running: the gateway routes around a dead stage and sees it return within a second
(gateway/routing.py), so one crashed process costs the requests in flight on it, not the deployment. Its
``/dev/shm`` files are swept as soon as it is reaped. A stage that crashes more often than the restart budget
allows (a crash loop: a bad disk, a poisoned model, an OOM at every start) stops everything and the launcher
exits 1 naming it. SIGTERM/SIGINT drain the gateway first, then the codec, then the talker, and the launcher
exits 0 when all of them did.

GPU sharing: when a stage sets ``mps_active_thread_percentage`` and shares its GPU with another stage
process, the launcher runs a CUDA MPS control daemon of its own for the launch (``voxstage.stage.mps``),
unless one answers already; it refuses to start, saying why, when the share could not work.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from voxstage.config import ConfigError, DeployConfig
from voxstage.config.cli_args import add_deploy_options, load_from_args
from voxstage.health_probe import check, check_https
from voxstage.lifetime import child_env
from voxstage.placement import Placement, place
from voxstage.stage.mps import MpsUnavailableError, StageShare, mps_daemon, serve_plan
from voxstage.stage.tls import LinkTls, LinkTlsError, add_link_options, launch_link
from voxstage.transport.shm_reader import sweep_dead_regions

log = logging.getLogger("voxstage.serve")
EXIT_INVALID = 2
EXIT_STAGE_FAILED = 1
POLL_S = 0.2


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "serve",
        help="run talker, codec and gateway as separate processes on this host",
        description="Start the deploy file's stages as processes (talker, then codec, then gateway), each "
        "once the previous one is SERVING; forward SIGTERM/SIGINT and drain them in reverse order.",
    )
    p.add_argument("config", metavar="FILE", help="deploy YAML file")
    p.add_argument(
        "--model", default=None, help="checkpoint directory or preset (default: the file's `model`)"
    )
    p.add_argument("--host", default=None, help="gateway listen address (default: gateway.host)")
    p.add_argument(
        "--grpc-port", type=int, default=None, help="public gRPC port (default: gateway.grpc_port)"
    )
    p.add_argument("--http-port", type=int, default=None, help="HTTP port (default: gateway.http_port)")
    p.add_argument("--stage-host", default="127.0.0.1", help="address talker and codec listen on")
    p.add_argument(
        "--talker-port",
        type=int,
        default=0,
        help="talker gRPC port; replica k of several gets PORT+k (default: free ports)",
    )
    p.add_argument("--codec-port", type=int, default=0, help="codec gRPC port, as --talker-port")  # fmt: skip
    p.add_argument(
        "--talker-metrics-port", type=int, default=None, metavar="PORT",
        help="serve the talker's Prometheus /metrics on --stage-host:PORT (replica k: PORT+k); default: off",
    )  # fmt: skip
    p.add_argument(
        "--codec-metrics-port", type=int, default=None, metavar="PORT",
        help="the codec's /metrics, as --talker-metrics-port",
    )  # fmt: skip
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto", help="device of both stages")
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads per stage (CPU)")
    p.add_argument("--no-gateway", action="store_true", help="start talker and codec only")
    p.add_argument("--start-timeout", type=float, default=600.0, help="seconds each stage may take to start")
    p.add_argument("--drain-grace", type=float, default=30.0, help="seconds each stage may drain on stop")
    r = p.add_argument_group(
        "supervision",
        "A stage that dies after start-up is restarted alone (same address and flags) while the others keep "
        "running; the first restart waits --restart-backoff seconds, each further one within "
        "--restart-window twice as long, up to --restart-backoff-max. A stage that would need more than "
        "--restart-budget restarts within --restart-window stops everything (exit 1, naming it). A stage "
        "that never reports SERVING at the first start still fails the launch at once.",
    )
    r.add_argument("--restart-backoff", type=float, default=0.5, metavar="S", help="first back-off (0.5)")
    r.add_argument("--restart-backoff-max", type=float, default=10.0, metavar="S", help="back-off cap (10)")
    r.add_argument(
        "--restart-budget",
        type=int,
        default=5,
        metavar="N",
        help="restarts allowed per stage within --restart-window (5; 0 = never restart: any death stops all)",
    )
    r.add_argument("--restart-window", type=float, default=300.0, metavar="S", help="budget window (300)")
    add_link_options(p, client=True, what="every process it starts (else the file's gateway.link_* keys)")
    add_deploy_options(p)
    p.set_defaults(handler=run)


@dataclass
class Stage:
    name: str
    address: str  # host:port of its gRPC health
    proc: subprocess.Popen[bytes]
    flags: list[str] = field(default_factory=list)  # what it was started with: a restart reuses them
    visible: str | None = None
    restarts: deque[float] = field(default_factory=deque)  # when each restart in the window was scheduled
    restart_at: float | None = None  # set while dead and waiting out its back-off
    starting_since: float | None = None  # set while a restarted process has not reported SERVING yet
    tls: LinkTls | None = None  # what a health probe of a stage port presents (stage-link mTLS)
    https_health: str | None = None  # a gateway serving TLS: its HTTP /health, probed unverified

    def serving(self, timeout: float) -> bool:
        if self.https_health is not None:
            return check_https(self.https_health, timeout)
        return check(self.address, timeout=timeout, tls=self.tls)


@dataclass(frozen=True)
class RestartPolicy:
    backoff_s: float = 0.5
    max_backoff_s: float = 10.0
    budget: int = 5
    window_s: float = 300.0

    def backoff(self, recent_restarts: int) -> float:
        return min(self.backoff_s * 2**recent_restarts, self.max_backoff_s)


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s serve[%(process)d] %(levelname)s %(message)s")
    try:
        config = load_from_args(args.config, args)
    except ConfigError as exc:
        for issue in exc.issues:
            print(issue, file=sys.stderr)
        return EXIT_INVALID
    model = args.model or (str(config.model_path()) if config.model_path() else config.model)
    if not model:
        print(f"{args.config}: no model: pass --model or set `model` in the file", file=sys.stderr)
        return EXIT_INVALID
    try:
        link = launch_link(args, config.gateway)  # one set of files for talker, codec and gateway
    except LinkTlsError as exc:
        print(f"voxstage serve: {exc}", file=sys.stderr)
        return EXIT_INVALID
    # Materialize a preset once here, so the stage processes do not race to build the same directory.
    from voxstage.presets import resolve_model

    try:
        resolve_model(model)
    except Exception as exc:  # noqa: BLE001 - a bad --model is a usage error with its own message
        print(f"voxstage serve: {exc}", file=sys.stderr)
        return EXIT_INVALID
    policy = RestartPolicy(
        args.restart_backoff, args.restart_backoff_max, args.restart_budget, args.restart_window
    )
    if min(policy.backoff_s, policy.max_backoff_s, policy.budget, policy.window_s) < 0:
        print("voxstage serve: --restart-* values must not be negative", file=sys.stderr)
        return EXIT_INVALID
    deploy = _deploy_flags(args)
    tls = None if link is None else link.tls
    talker_tls, codec_tls = (link.stage_flags(client=c) for c in (False, True)) if link else ([], [])
    host = args.stage_host
    stage_flags = ["--config", args.config, "--model", model, "--host", host, "--device", args.device]
    stage_flags += ["--drain-grace", str(args.drain_grace)]
    if args.threads is not None:
        stage_flags += ["--threads", str(args.threads)]
    stopping: list[int] = []

    def on_signal(signum: int, _frame: object) -> None:
        stopping.append(signum)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    stages: list[Stage] = []
    try:  # replicas, ports and GPUs of every stage process (voxstage.placement)
        gw = config.gateway  # the stages' free ports must not be the gateway's, which binds last
        public = () if args.no_gateway else (args.grpc_port or gw.grpc_port, args.http_port or gw.http_port)
        talkers, codecs = place(
            config, host, talker_port=args.talker_port, codec_port=args.codec_port,
            talker_metrics_port=args.talker_metrics_port, codec_metrics_port=args.codec_metrics_port,
            reserved=public,
        )  # fmt: skip
    except ValueError as exc:
        print(f"{args.config}: {exc}", file=sys.stderr)
        return EXIT_INVALID
    try:
        mps_line = serve_plan(_shares(config, [*talkers, *codecs]), args.device, os.environ)
    except MpsUnavailableError as exc:
        print(f"voxstage serve: {exc}", file=sys.stderr)
        return EXIT_INVALID
    daemon = contextlib.ExitStack()  # closed last: the daemon quits once no stage process is left
    try:
        if mps_line is not None:
            root = Path(tempfile.mkdtemp(prefix="vx-mps-"))  # short: the pipe is a unix socket path
            daemon.callback(shutil.rmtree, root, ignore_errors=True)
            log.info("%s; pipe and log directories under %s", mps_line, root)
            try:
                daemon.enter_context(mps_daemon(root))
            except (MpsUnavailableError, OSError, subprocess.SubprocessError) as exc:
                log.error("could not start the MPS daemon the stages' shares need: %s", exc)
                return EXIT_STAGE_FAILED
        talker_list = ",".join(t.address for t in talkers)
        codec_list = ",".join(c.address for c in codecs)
        # The codecs dial only this launch's talkers, whatever a StreamOpen names (docs/protocol.md §1).
        plan = [(t, ["--port", str(t.port), *talker_tls]) for t in talkers]
        plan += [(c, ["--port", str(c.port), "--allowed-talkers", talker_list, *codec_tls]) for c in codecs]
        # Every talker and codec starts at once: their addresses are placed up front, a codec dials a talker
        # only when a stream names it, and each stage's memory budget is a share of the GPU's total, not of
        # what is free when it looks. Loading in parallel saves a stage's start-up (seconds) per launch.
        for pl, extra in plan:
            argv = [*stage_flags, *_metrics(extra, pl.metrics_port), *deploy]
            stages.append(_start(pl.name, argv, pl.address, pl.visible, tls))
        for started in stages:
            if not _wait_serving(started, args.start_timeout, stopping):
                return _abort(stages, args.drain_grace, stopping)
        if not args.no_gateway:
            if gw.codec_addresses or gw.talker_addresses:
                log.warning("gateway.codec_addresses / talker_addresses: not used, the gateway gets the "
                            "addresses of the stages started here")  # fmt: skip
            port = args.grpc_port or gw.grpc_port
            flags = [
                "--config",
                args.config,
                "--codec",
                codec_list,
                "--talker",
                talker_list,
            ]
            flags += ["--grpc-port", str(port), "--http-port", str(args.http_port or gw.http_port)]
            if args.host:
                flags += ["--host", args.host]
            listen = args.host or gw.host
            probe = f"{'127.0.0.1' if listen in ('0.0.0.0', '::') else listen}:{port}"
            overrides = link.gateway_overrides() if link else []
            stages.append(_start("gateway", [*flags, *deploy, *overrides], probe, None))
            if gw.tls_cert_file:  # the gRPC health check would need the public certificate's trust root
                http = args.http_port or gw.http_port
                stages[-1].https_health = f"https://{probe.rsplit(':', 1)[0]}:{http}/health"
            if not _wait_serving(stages[-1], args.start_timeout, stopping):
                return _abort(stages, args.drain_grace, stopping)
        log.info("all stages SERVING: %s", ", ".join(f"{s.name} {s.address}" for s in stages))
        failed = _supervise(stages, policy, args.start_timeout, stopping)
        if failed is not None:
            _stop_all([o for o in stages if o is not failed and o.restart_at is None], args.drain_grace)
            return EXIT_STAGE_FAILED
        # A stage dead and waiting out its back-off when the signal came has nothing left to drain.
        return _stop_all([s for s in stages if s.restart_at is None], args.drain_grace)
    finally:
        for s in stages:  # nothing outlives the launcher, whatever path got here
            if s.proc.poll() is None:
                s.proc.kill()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    s.proc.wait(10.0)
        daemon.close()


def _shares(config: DeployConfig, placed: Sequence[Placement]) -> list[StageShare]:
    """Each stage process's GPU (the first it sees) and MPS share, for ``serve_plan``."""
    stage = {"talker": config.talker, "codec": config.codec}
    return [
        StageShare(p.name, p.visible.split(",")[0], stage[p.role].mps_active_thread_percentage)
        for p in placed
    ]


def _deploy_flags(args: argparse.Namespace) -> list[str]:
    flags = ["--platform", args.platform] if args.platform else []
    for item in args.overrides:
        flags += ["--set", item]
    return flags


def _metrics(flags: list[str], port: int | None) -> list[str]:
    return flags if port is None else [*flags, "--metrics-port", str(port)]


def _spawn(name: str, flags: Sequence[str], visible: str | None) -> subprocess.Popen[bytes]:
    # A launcher killed with SIGKILL cannot forward anything; the kernel then stops its children for it
    # (armed by the child itself: voxstage.lifetime says why not in a preexec_fn).
    env = child_env(os.environ)
    if visible is not None:
        env["CUDA_VISIBLE_DEVICES"] = visible
    role = name.partition("-")[0]  # a replica's name is its role plus its index (talker-1)
    cmd = [sys.executable, "-m", "voxstage", role, *flags]
    log.info("starting %s: %s", name, " ".join(cmd))
    return subprocess.Popen(cmd, env=env, start_new_session=True)  # noqa: S603


def _start(
    name: str, flags: Sequence[str], address: str, visible: str | None, tls: LinkTls | None = None
) -> Stage:
    return Stage(name, address, _spawn(name, flags, visible), list(flags), visible, tls=tls)


def _supervise(
    stages: Sequence[Stage], policy: RestartPolicy, start_timeout: float, stopping: list[int]
) -> Stage | None:
    """Keep every stage running until a signal comes (then None) or one spends its restart budget (then
    that stage). One stage's crash, back-off and restart never block watching the others."""
    while not stopping:
        now = time.monotonic()
        for s in stages:
            if s.restart_at is not None:
                if now >= s.restart_at:
                    s.restart_at = None
                    s.proc = _spawn(s.name, s.flags, s.visible)
                    s.starting_since = time.monotonic()
                continue
            code = s.proc.poll()
            if code is None and s.starting_since is not None:
                code = _check_restarted(s, start_timeout)
            if code is not None and not _on_crash(s, code, policy):
                return s
        time.sleep(POLL_S)
    return None


def _check_restarted(stage: Stage, start_timeout: float) -> int | None:
    """A restarted stage is watched like a first start, without blocking the loop: SERVING ends it; one
    stuck past ``start_timeout`` is killed and counts as another crash (its exit code is returned)."""
    assert stage.starting_since is not None
    if stage.serving(0.5):
        log.info(
            "%s stage is SERVING again on %s (pid %d, %.1f s after its restart)",
            stage.name,
            stage.address,
            stage.proc.pid,
            time.monotonic() - stage.starting_since,
        )
        stage.starting_since = None
        return None
    if time.monotonic() - stage.starting_since <= start_timeout:
        return None
    log.error(
        "%s stage did not report SERVING within %.0f s of its restart; killing it", stage.name, start_timeout
    )
    stage.proc.kill()
    return stage.proc.wait()


def _on_crash(stage: Stage, code: int, policy: RestartPolicy) -> bool:
    """Log the death, sweep its shared memory, schedule a restart; False when the budget is spent."""
    phase = "during its restart" if stage.starting_since is not None else "unexpectedly"
    stage.starting_since = None
    log.error("%s stage (pid %d) exited %s with code %s", stage.name, stage.proc.pid, phase, code)
    _sweep_shm(stage)
    now = time.monotonic()
    while stage.restarts and stage.restarts[0] < now - policy.window_s:
        stage.restarts.popleft()
    if len(stage.restarts) >= policy.budget:
        log.error(
            "%s stage died again after %d restart(s) within %.0f s (--restart-budget %d): "
            "stopping all stages",
            stage.name,
            len(stage.restarts),
            policy.window_s,
            policy.budget,
        )
        return False
    delay = policy.backoff(len(stage.restarts))
    stage.restarts.append(now)
    stage.restart_at = now + delay
    log.warning(
        "restarting %s stage in %.1f s (restart %d of %d allowed per %.0f s)",
        stage.name,
        delay,
        len(stage.restarts),
        policy.budget,
        policy.window_s,
    )
    return True


def _sweep_shm(stage: Stage) -> None:
    # A kill -9 leaves the dead process's regions behind; the survivors reap them only when a stream
    # breaks, and a restarted stage sweeps only at its own start, so sweep now (only dead owners' files go).
    try:
        removed = sweep_dead_regions()
    except OSError as exc:
        log.warning("could not sweep /dev/shm after the %s stage died: %s", stage.name, exc)
        return
    if removed:
        log.info("removed %d /dev/shm file(s) of dead processes: %s", len(removed), ", ".join(removed))


def _wait_serving(stage: Stage, timeout: float, stopping: list[int]) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not stopping:
        code = stage.proc.poll()
        if code is not None:
            log.error("%s stage exited with code %d during start-up (see its log above)", stage.name, code)
            return False
        if stage.serving(1.0):
            log.info("%s stage is SERVING on %s", stage.name, stage.address)
            return True
        time.sleep(POLL_S)
    if not stopping:
        log.error("%s stage did not report SERVING within %.0f s", stage.name, timeout)
    return False


def _abort(stages: Sequence[Stage], grace: float, stopping: list[int]) -> int:
    """A stage failed to start (or a signal came during start-up): stop what runs, report which."""
    code = _stop_all(stages, grace)
    return code if stopping else EXIT_STAGE_FAILED


def _stop_all(stages: Sequence[Stage], grace: float) -> int:
    """SIGTERM in reverse start order (gateway, codecs, talkers), each stage drained before the next;
    the replicas of one stage drain together."""
    code = 0
    groups: dict[str, list[Stage]] = {}
    for s in reversed(stages):
        groups.setdefault(s.name.partition("-")[0], []).append(s)
    for group in groups.values():
        for s in group:
            if s.proc.poll() is None:
                s.proc.send_signal(signal.SIGTERM)
        for s in group:
            try:
                s.proc.wait(grace + 10.0)
            except subprocess.TimeoutExpired:
                log.error("%s stage did not stop within %.0f s; killing it", s.name, grace + 10.0)
                s.proc.kill()
                s.proc.wait()
            rc = s.proc.returncode
            log.info("%s stage exited with code %s", s.name, rc)
            code = code or (0 if rc == 0 else EXIT_STAGE_FAILED)
    return code
