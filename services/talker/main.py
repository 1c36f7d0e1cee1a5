"""``voxstage talker``: one talker stage process (load, budget, warm up, serve, drain).

Only argparse work happens at import; the model stack is imported when the command runs, so the CLI stays
light for ``validate-config``.
"""

from __future__ import annotations

import argparse
import logging
from typing import TYPE_CHECKING, Any

from voxstage.stage.process import StageParts, StageStartError, register_stage, stage_parts

if TYPE_CHECKING:
    from services.talker.pacing import Pacing
    from voxstage.config import StageConfig
    from voxstage.config.connector import ChunkPlan

log = logging.getLogger(__name__)
DEFAULT_PORT = 50061
# Cap on the prefix cache when the budget is unbounded (CPU) or generous.
PREFIX_CACHE_BYTES = 256 << 20


def register(subparsers: Any) -> None:
    register_stage(
        subparsers,
        "talker",
        help="run the talker stage (text -> codec frames) as a gRPC server",
        description="Serve voxstage.internal.v1.Talker for the deploy file's talker stage (stage 0).",
        default_port=DEFAULT_PORT,
        build=build,
        logger=log,
    )


def build(args: argparse.Namespace) -> StageParts:
    from services.talker.engine import EngineConfig, TalkerEngine
    from services.talker.models import load_talker
    from services.talker.servicer import SERVICE_NAME, TalkerServicer
    from services.talker.voice_cache import VoiceCache
    from services.talker.worker import TalkerDefaults, TalkerWorker
    from voxstage.families import family
    from voxstage.internal.v1 import stage_pb2_grpc
    from voxstage.server import ServiceBinding
    from voxstage.stage.process import device_budget, load_stage_setup
    from voxstage.transport.shm import ShmWriter, sweep_dead_regions

    config, device, dtype, source = load_stage_setup(args, log, cuda_default="bfloat16", role="talker")
    stage = config.talker
    adapter, info = load_talker(source, device=device, dtype=dtype)
    use_kv_cache_dtype(adapter, stage.kv_cache_dtype)
    if family(source.family).duplex:
        return _build_duplex(config, device, adapter, info)
    limit = info.max_positions
    max_len = stage.max_model_len or limit
    if max_len > limit:
        raise StageStartError(f"stages[0].max_model_len is {max_len}; {source.name} supports at most {limit}")
    budget = device_budget(device, stage.gpu_memory_utilization, "talker")
    prefix_bytes = PREFIX_CACHE_BYTES if stage.enable_prefix_caching else 0
    if budget is not None:
        kv = adapter.kv_bytes_per_token() * max_len * stage.max_num_seqs
        budget.require(
            kv,
            f"talker KV cache (max_num_seqs {stage.max_num_seqs} x max_model_len {max_len})",
            "lower max_num_seqs or max_model_len, or raise gpu_memory_utilization",
        )
        prefix_bytes = min(prefix_bytes, max(budget.available - kv, 0))
        gib = kv / (1 << 30)
        log.info("talker: memory budget %s; KV %.2f GiB (%s)", budget.describe(), gib, stage.kv_cache_dtype)
    # Every bucket is captured by the warm-up, before SERVING.
    graphs = device == "cuda" and not stage.enforce_eager and adapter.enable_cuda_graphs()
    if device == "cuda" and not stage.enforce_eager and not graphs:
        log.warning("talker: family %s has no CUDA-graph frame step; running eager", info.family)
    engine = TalkerEngine(
        adapter,
        EngineConfig(
            max_num_seqs=stage.max_num_seqs,
            max_model_len=max_len,
            max_num_batched_tokens=stage.batched_token_budget,
            enable_prefix_caching=stage.enable_prefix_caching,
            prefix_cache_bytes=prefix_bytes,
            async_scheduling=stage.async_scheduling,
            pacing=pacing_of(
                stage, info.frame_rate_hz, config.chunk_plan, family_pacing(source.family, device)
            ),
        ),
    )
    defaults = TalkerDefaults.from_deploy(stage, info)
    try:
        adapter.check_sampling(defaults.sampling, defaults.subtalker)
    except ValueError as exc:
        raise StageStartError(f"stages[0].default_sampling_params: {exc}") from None
    worker = TalkerWorker(engine, info, defaults)
    sweep_dead_regions()  # files of dead voxstage processes (both ends crashed earlier)
    writer = ShmWriter(threshold_bytes=config.stream.shm_threshold_bytes) if config.shared_memory else None
    voices = VoiceCache(stage.voice_cache_bytes, stage.voice_cache_entries)
    servicer = TalkerServicer(worker, plan=config.chunk_plan, shm_writer=writer, voices=voices)
    log.info(
        "talker: %s (%s, %s) on %s/%s: %d slots x %d positions, prefix cache %s, %s, %s, shm %s",
        info.model, info.family, info.variant, device, str(dtype).removeprefix("torch."), stage.max_num_seqs,
        max_len, "on" if stage.enable_prefix_caching else "off",
        "CUDA graphs" if graphs else "eager",
        "async scheduling" if stage.async_scheduling else "sync scheduling",
        f"above {writer.threshold_bytes} B" if writer else "off",
    )  # fmt: skip

    binding = ServiceBinding(SERVICE_NAME, servicer, stage_pb2_grpc.add_TalkerServicer_to_server)
    return stage_parts(
        "talker", binding, servicer, worker, lambda: worker.warm_up(info.warm_up), writer, budget=budget
    )


def pacing_of(
    stage: StageConfig,
    frame_rate_hz: float,
    plan: ChunkPlan | None = None,
    default: tuple[float, float] | None = None,
) -> Pacing:
    """The engine's ``Pacing`` from the talker stage's ``pace_*`` keys; when the deploy file sets neither
    ``pace_realtime_x`` nor ``pace_ahead_s``, the family's ``default`` (its descriptor's ``talker_pacing``
    on a GPU; None: unpaced). With the deploy file's chunk ``plan``, settings that would starve it are
    logged as warnings."""
    from services.talker.pacing import Pacing, pacing_warnings

    x, ahead = stage.pace_realtime_x, stage.pace_ahead_s
    if default is not None and x is None and ahead is None:
        x, ahead = default
        log.info(
            "talker: paced under load by the family's default (pace_realtime_x %g, pace_ahead_s %g; "
            "pace_realtime_x: 0 turns it off)", x, ahead,
        )  # fmt: skip
    if stage.pace_ride_s is not None and ahead is None:
        log.warning("talker: stages[0].pace_ride_s does nothing: no pace_ahead_s, nor a family pacing here")
    if plan is not None:
        for warning in pacing_warnings(ahead, x or None, plan.steady_frames, plan.ramp, frame_rate_hz):
            log.warning("talker: %s", warning)
    return Pacing(
        min_step_interval_s=1.0 / (frame_rate_hz * x) if x else 0.0,
        ahead_s=ahead or 0.0,
        # Unset: as far again as the cushion. Riding 3 s past a 3 s cushion took Qwen3-TTS 0.6B through the
        # openai client from 64 to 128 gap-free streams on one H100 (docs/benchmarks.md, twentieth session).
        ride_s=(ahead or 0.0) if stage.pace_ride_s is None else stage.pace_ride_s,
        from_streams=stage.pace_from_streams,
        frame_s=1.0 / frame_rate_hz,
    )


def family_pacing(family_name: str, device: str) -> tuple[float, float] | None:
    """The family's pacing default: pacing shares a GPU with the codec, so off a GPU there is none."""
    from voxstage.families import family

    return family(family_name).talker_pacing if device == "cuda" else None


def use_kv_cache_dtype(adapter: Any, name: str) -> None:
    """``stages[0].kv_cache_dtype`` onto the loaded family, before its KV is sized or allocated; a family
    that cannot store it refuses with its reason (a key that is accepted must do something)."""
    try:
        adapter.use_kv_cache_dtype(name)
    except ValueError as exc:
        raise StageStartError(f"stages[0].kv_cache_dtype: {exc}") from None


def _build_duplex(config: Any, device: str, adapter: Any, info: Any) -> StageParts:
    """A duplex family's talker: sessions over the ring-KV pool, one batched frame step per tick."""
    from services.talker.duplex.engine import DuplexConfig, DuplexEngine
    from services.talker.duplex.worker import DuplexWorker
    from services.talker.servicer import SERVICE_NAME, TalkerServicer
    from services.talker.voice_cache import VoiceCache
    from services.talker.worker import TalkerDefaults
    from voxstage.internal.v1 import stage_pb2_grpc
    from voxstage.server import ServiceBinding
    from voxstage.stage.process import device_budget
    from voxstage.transport.shm import ShmWriter, sweep_dead_regions

    stage = config.talker
    context = info.max_positions
    window = stage.max_model_len or context
    if window > context:
        raise StageStartError(
            f"stages[0].max_model_len is {window}; {info.model}'s attention window is {context} frames"
        )
    budget = device_budget(device, stage.gpu_memory_utilization, "talker")
    if budget is not None:
        kv = adapter.kv_bytes_per_position() * window * stage.max_num_seqs
        budget.require(
            kv,
            f"talker KV rings (max_num_seqs {stage.max_num_seqs} sessions x {window} positions)",
            "lower max_num_seqs or max_model_len, or raise gpu_memory_utilization",
        )
        gib = kv / (1 << 30)
        log.info("talker: memory budget %s; KV %.2f GiB (%s)", budget.describe(), gib, stage.kv_cache_dtype)
    if stage.enable_prefix_caching:
        log.warning("talker: enable_prefix_caching has no effect on duplex sessions (prompts are prefilled)")
    if stage.async_scheduling:
        # A duplex step answers this tick's user frames; there is no later step to overlap it with.
        log.warning("talker: async_scheduling has no effect on duplex sessions (each tick's step is awaited)")
    # Every bucket is captured by the warm-up, before SERVING.
    graphs = device == "cuda" and not stage.enforce_eager and adapter.enable_cuda_graphs()
    engine = DuplexEngine(
        adapter,
        DuplexConfig(
            max_sessions=stage.max_num_seqs,
            window=window,
            prefill_budget=stage.batched_token_budget,
            prefill_time_s=config.duplex.join_prefill_ms / 1e3,
        ),
    )
    worker = DuplexWorker(engine, info, TalkerDefaults.from_deploy(stage, info))
    sweep_dead_regions()
    writer = ShmWriter(threshold_bytes=config.stream.shm_threshold_bytes) if config.shared_memory else None
    voices = VoiceCache(stage.voice_cache_bytes, stage.voice_cache_entries)
    servicer = TalkerServicer(worker, plan=config.chunk_plan, shm_writer=writer, voices=voices)
    log.info(
        "talker: %s (%s, duplex) on %s: %d sessions x %d-frame window, prefill %d positions/tick, %s",
        info.model, info.family, device, stage.max_num_seqs, window, stage.batched_token_budget,
        "CUDA graphs" if graphs else "eager",
    )  # fmt: skip

    binding = ServiceBinding(SERVICE_NAME, servicer, stage_pb2_grpc.add_TalkerServicer_to_server)
    return stage_parts("talker", binding, servicer, worker, worker.warm_up, writer, budget=budget)
