"""What every stage process (talker, codec) shares: the subcommand and its options, the deploy file, model
and device selection, the memory budget, and the serve loop (start gRPC, warm up, report SERVING, drain on
SIGTERM).

Imports no torch at module level: the CLI imports this to build its parsers, and ``validate-config`` must
stay free of model code.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import logging
import signal
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, NamedTuple, Protocol

from voxstage.config.cli_args import add_deploy_options, load_from_args
from voxstage.heap import freeze_startup_heap
from voxstage.stage import torch_profile
from voxstage.stage.tls import LinkTlsError, add_link_options, link_from_args

if TYPE_CHECKING:
    from voxstage.config import DeployConfig
    from voxstage.presets import ModelSource

log = logging.getLogger(__name__)

GiB = 1 << 30
# Activations, allocator fragmentation and kernels' scratch: kept out of the KV/state budget.
WORKSPACE_FRACTION = 0.05
MIN_WORKSPACE_BYTES = 512 << 20
EXIT_START_FAILED = 1
EXIT_USAGE = 2
EXIT_ENGINE_FAILED = 3
# Stages listen on loopback unless told otherwise: their gRPC ports are internal (no auth), and a stage
# reachable from other hosts would let anyone open streams on it (and, for the codec, make it dial out).
DEFAULT_HOST = "127.0.0.1"


class StageStartError(RuntimeError):
    """The stage cannot start with this configuration; the message says why and what to change."""


def add_stage_options(parser: argparse.ArgumentParser, *, default_port: int) -> None:
    parser.add_argument("--config", required=True, metavar="FILE", help="deploy YAML file")
    parser.add_argument(
        "--model", default=None, help="checkpoint directory or preset name (default: the file's `model`)"
    )
    parser.add_argument(
        "--host", default=DEFAULT_HOST,
        help=f"listen address of the gRPC and metrics ports (default {DEFAULT_HOST}: this host only; "
        "0.0.0.0 for all interfaces, e.g. inside a container)",
    )  # fmt: skip
    parser.add_argument("--port", type=int, default=default_port, help=f"gRPC port (default {default_port})")
    parser.add_argument("--metrics-port", type=int, default=None, help="serve Prometheus /metrics here")
    parser.add_argument(
        "--device", choices=("auto", "cpu", "cuda"), default="auto", help="auto: cuda if visible"
    )
    parser.add_argument(
        "--dtype", choices=("auto", "float32", "bfloat16", "float16"), default="auto",
        help="weights/compute dtype (auto: the stage's default for the device)",
    )  # fmt: skip
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (CPU)")
    parser.add_argument(
        "--drain-grace", type=float, default=30.0, help="seconds in-flight streams get after SIGTERM"
    )
    parser.add_argument("--log-level", default="INFO", help="Python logging level (INFO)")
    add_deploy_options(parser)


def register_stage(
    subparsers: Any,
    role: str,
    *,
    help: str,
    description: str,
    default_port: int,
    build: Callable[[argparse.Namespace], StageParts],
    logger: logging.Logger,
    extra_options: Callable[[argparse.ArgumentParser], None] | None = None,
    dials_stages: bool = False,
) -> None:
    """Add the ``voxstage <role>`` subcommand: the options every stage takes, plus the role's own
    (``extra_options``); it runs ``run_stage``. ``dials_stages``: the stage is also a client of other
    stages (the codec dials talkers), so it takes ``--link-server-name`` too."""
    parser = subparsers.add_parser(role, help=help, description=description)
    add_stage_options(parser, default_port=default_port)
    add_link_options(parser, client=dials_stages, what=f"the {role} (its gRPC port"
                     + (" and its channels to talkers)" if dials_stages else ")"))  # fmt: skip
    if extra_options is not None:
        extra_options(parser)
    parser.set_defaults(handler=functools.partial(run_stage, role=role, build=build, logger=logger))


def run_stage(
    args: argparse.Namespace,
    role: str,
    build: Callable[[argparse.Namespace], StageParts],
    logger: logging.Logger,
) -> int:
    """Build the stage, then serve it; a start-up failure exits ``EXIT_START_FAILED`` with its reason.

    ``logger`` is the stage's own (its name is part of every log line), not this module's."""
    setup_logging(args.log_level, role)
    try:
        # Read before the model loads, so a half-configured set fails in a second, naming the flag. Kept on
        # ``args``: the codec's build hands it to its talker channels.
        args.link_tls = link_from_args(args)
    except LinkTlsError as exc:
        logger.error("%s: cannot start: %s", role, exc)
        return EXIT_USAGE
    try:
        torch_profile.arm(role)  # only where VOXSTAGE_TORCH_PROFILE is set
        parts = build(args)
    except Exception as exc:  # noqa: BLE001 - any start-up failure ends the process with its reason
        logger.error("%s: cannot start: %s", role, exc)
        logger.debug("start-up failure", exc_info=True)
        return EXIT_START_FAILED
    return asyncio.run(serve(parts, args))


class StageSetup(NamedTuple):
    config: DeployConfig
    device: str
    dtype: Any  # torch.dtype (torch is imported only once a stage is built)
    source: ModelSource


def load_stage_setup(
    args: argparse.Namespace, logger: logging.Logger, *, cuda_default: str, role: Literal["talker", "codec"]
) -> StageSetup:
    """The deploy file (its warnings logged on the stage's ``logger``), the device and dtype, and where the
    model comes from: ``--model``, else the file's ``model``. The ``role`` stage's MPS share is applied
    before anything touches CUDA. Imports torch (through the device choice)."""
    from voxstage.presets import resolve_model
    from voxstage.stage.mps import MpsUnavailableError, apply_thread_percentage

    config = load_from_args(args.config, args)
    for warning in config.warnings:
        logger.warning("%s", warning)
    spec = args.model or (str(config.model_path()) if config.model_path() else config.model)
    if not spec:
        raise StageStartError("no model: pass --model or set `model` in the deploy file")
    share = (config.talker if role == "talker" else config.codec).mps_active_thread_percentage
    if share is not None and args.device == "cpu":
        logger.warning("%s: mps_active_thread_percentage has no effect with --device cpu", role)
    elif share is not None:
        try:
            logger.info("%s: %s", role, apply_thread_percentage(share))
        except MpsUnavailableError as exc:
            raise StageStartError(str(exc)) from None
    device = select_device(args.device, args.threads)
    torch_profile.prepare(device)  # armed stages only: after the MPS share, before any graph capture
    dtype = select_dtype(args.dtype, device, cuda_default=cuda_default)
    return StageSetup(config, device, dtype, resolve_model(spec))


def setup_logging(level: str, role: str) -> None:
    logging.basicConfig(
        level=level.upper(), format=f"%(asctime)s {role}[%(process)d] %(levelname)s %(name)s: %(message)s"
    )


def select_device(choice: str, threads: int | None) -> str:
    import torch

    if threads is not None:
        torch.set_num_threads(threads)
    if choice == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if choice == "cuda" and not torch.cuda.is_available():
        raise StageStartError("--device cuda: no CUDA device is visible to this process")
    return choice


def select_dtype(choice: str, device: str, cuda_default: str) -> Any:
    import torch

    name = choice if choice != "auto" else (cuda_default if device == "cuda" else "float32")
    return getattr(torch, name)


@dataclass(frozen=True)
class MemoryBudget:
    """A stage's share of one GPU: ``fraction x total - weights - workspace`` is left for KV/state."""

    total: int
    fraction: float
    weights: int
    workspace: int

    @property
    def available(self) -> int:
        return int(self.fraction * self.total) - self.weights - self.workspace

    def require(self, need: int, what: str, hint: str) -> None:
        if need > self.available:
            raise StageStartError(
                f"{what} needs {need / GiB:.2f} GiB, but the budget leaves "
                f"{max(self.available, 0) / GiB:.2f} GiB (gpu_memory_utilization {self.fraction} x "
                f"{self.total / GiB:.1f} GiB - weights {self.weights / GiB:.2f} GiB - workspace "
                f"{self.workspace / GiB:.2f} GiB); {hint}"
            )

    def describe(self) -> str:
        return (
            f"{self.fraction} x {self.total / GiB:.1f} GiB, weights {self.weights / GiB:.2f} GiB, workspace "
            f"{self.workspace / GiB:.2f} GiB -> {self.available / GiB:.2f} GiB for KV/state"
        )


def device_budget(device: str, fraction: float, role: str) -> MemoryBudget | None:
    """Measured after the weights are loaded; None on CPU, where memory is the host's and unbudgeted."""
    if device != "cuda":
        log.info("%s: running on CPU: gpu_memory_utilization has no effect (no device memory budget)", role)
        return None
    import torch

    total = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
    weights = torch.cuda.memory_allocated()
    workspace = max(MIN_WORKSPACE_BYTES, int(WORKSPACE_FRACTION * total))
    return MemoryBudget(total=total, fraction=fraction, weights=weights, workspace=workspace)


class Servicer(Protocol):
    ready: bool
    draining: bool

    def active(self) -> int: ...

    async def wait_idle(self) -> None:
        """Return once no stream is open."""
        ...


@dataclass
class StageParts:
    """A loaded stage, ready to serve: its gRPC bindings, its servicer and its engine's lifecycle."""

    role: str
    bindings: Sequence[Any]  # voxstage.server.ServiceBinding
    servicer: Servicer
    start: Callable[[asyncio.AbstractEventLoop, Callable[[str], None]], None]
    warm_up: Callable[[], Awaitable[float]]
    stop: Callable[[], None]
    budget: MemoryBudget | None = None  # the device share it was sized against (None on CPU)


def stage_parts(
    role: str,
    binding: Any,
    servicer: Servicer,
    worker: Any,
    warm_up: Callable[[], Awaitable[float]],
    *closers: Any,
    budget: MemoryBudget | None = None,
) -> StageParts:
    """A built stage's parts: its gRPC binding, the worker's engine-thread lifecycle, and a ``stop`` that
    stops the engine thread and then closes the shared-memory endpoints given (None: not used)."""

    def stop() -> None:
        worker.stop()
        for endpoint in closers:
            if endpoint is not None:
                endpoint.close()

    return StageParts(
        role=role,
        bindings=[binding],
        servicer=servicer,
        start=lambda loop, on_fatal: worker.start(loop, on_fatal),
        warm_up=warm_up,
        stop=stop,
        budget=budget,
    )


def held_after_start_up(role: str, budget: MemoryBudget | None, reserved: int) -> str | None:
    """A warning when a stage holds more device memory after its warm-up (``reserved``: weights, state,
    CUDA graphs, cached activations) than its ``gpu_memory_utilization`` share: the start-up check sized
    only the weights and the KV/state against it, and the graphs' pools come on top. None when within."""
    if budget is None:
        return None
    share = int(budget.fraction * budget.total)
    if reserved <= share:
        return None
    return (
        f"{role}: holds {reserved / GiB:.2f} GiB of device memory after start-up, over its share of "
        f"{share / GiB:.2f} GiB (gpu_memory_utilization {budget.fraction} x {budget.total / GiB:.1f} GiB): "
        "its CUDA graphs and cached activations come on top of the weights and state the budget checked; "
        "another process on this GPU may run out of memory (lower max_num_seqs, or raise the share)"
    )


async def serve(parts: StageParts, args: argparse.Namespace) -> int:
    """Serve until SIGTERM/SIGINT (drain, exit 0) or until the engine thread dies (exit 3)."""
    from voxstage.server import start_stage_server

    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    fatal: list[str] = []

    def on_fatal(message: str) -> None:
        fatal.append(message)
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    parts.start(loop, on_fatal)
    link = getattr(args, "link_tls", None)
    stage = await start_stage_server(
        parts.bindings,
        host=args.host,
        port=args.port,
        metrics_port=args.metrics_port,
        credentials=None if link is None else link.server_credentials(),
    )
    try:
        seconds = await parts.warm_up()
        log.info("%s: warm-up request took %.2f s", parts.role, seconds)
        if parts.budget is not None:
            import torch

            warning = held_after_start_up(parts.role, parts.budget, torch.cuda.memory_reserved())
            if warning:
                log.warning("%s", warning)
        frozen = freeze_startup_heap()
        log.info("%s: %d start-up objects frozen out of the garbage collector", parts.role, frozen)
        parts.servicer.ready = True
        await stage.set_ready()
        log.info(
            "%s: SERVING on %s:%d (%s)", parts.role, args.host, stage.port,
            "mutual TLS: clients need a certificate from --link-ca" if link else "plain gRPC",
        )  # fmt: skip
        await stop.wait()
        if fatal:
            log.error("%s: engine thread failed (%s); stopping", parts.role, fatal[0])
            parts.servicer.draining = True
            await stage.health.enter_graceful_shutdown()
            await stage.server.stop(1.0)  # lets the failed streams' terminals go out
            return EXIT_ENGINE_FAILED
        await drain(parts.servicer, stage, args.drain_grace, parts.role)
        return 0
    finally:
        parts.stop()


async def drain(servicer: Servicer, stage: Any, grace: float, role: str) -> None:
    """NOT_SERVING first (health stays reachable, so probes see the state), refuse new streams, let the
    in-flight ones finish for up to ``grace`` seconds, then stop the server."""
    servicer.draining = True
    stage.draining = True
    await stage.health.enter_graceful_shutdown()
    deadline = time.monotonic() + grace
    log.info("%s: draining %d stream(s) for up to %.1f s", role, servicer.active(), grace)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(servicer.wait_idle(), max(deadline - time.monotonic(), 0.0))
    if servicer.active():
        log.warning(
            "%s: %d stream(s) still open after %.1f s; cancelling them", role, servicer.active(), grace
        )
    await stage.server.stop(0.5)
