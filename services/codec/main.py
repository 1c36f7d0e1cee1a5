"""``voxstage codec``: one codec stage process (load, budget, warm up, serve, drain).

Only argparse work happens at import; the model stack is imported when the command runs.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
from typing import TYPE_CHECKING, Any

from voxstage.stage.process import StageParts, StageStartError, register_stage, stage_parts

if TYPE_CHECKING:
    from services.codec.engine import CodecEngine
    from services.codec.models import CodecRuntime
    from services.codec.schedule import TickPolicy
    from services.codec.voice_states import VoiceStateCache
    from voxstage.config import DeployConfig
    from voxstage.config.stage import StageConfig
    from voxstage.presets import ModelSource
    from voxstage.stage.tls import LinkTls

log = logging.getLogger(__name__)
DEFAULT_PORT = 50062


def register(subparsers: Any) -> None:
    register_stage(
        subparsers,
        "codec",
        help="run the codec stage (codec frames -> PCM) as a gRPC server",
        description="Serve voxstage.internal.v1.Codec for the deploy file's codec stage (stage 1).",
        default_port=DEFAULT_PORT,
        build=build,
        logger=log,
        extra_options=_codec_options,
        dials_stages=True,
    )


def _codec_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--allowed-talkers", default="", metavar="HOST:PORT[,...]",
        help="the only talker addresses a stream's open may name (talker_address); others get "
        "PERMISSION_DENIED and are never dialled (default: empty, any talker)",
    )  # fmt: skip


def _allowed_talkers(args: argparse.Namespace) -> frozenset[str] | None:
    """``--allowed-talkers``, checked before the model loads (a typo fails the start at once)."""
    from services.codec.upstream import parse_allowed_talkers

    allowed = parse_allowed_talkers(getattr(args, "allowed_talkers", None))
    if allowed is None:
        log.info("codec: dials any talker a stream names (no --allowed-talkers)")
    else:
        log.info("codec: dials only the talkers %s", ", ".join(sorted(allowed)))
    return allowed


def build(args: argparse.Namespace) -> StageParts:
    from services.codec.models import load_codec
    from services.codec.servicer import SERVICE_NAME, CodecServicer
    from services.codec.upstream import TalkerPool
    from services.codec.worker import CodecWorker
    from voxstage.families import family
    from voxstage.internal.v1 import stage_pb2_grpc
    from voxstage.server import ServiceBinding
    from voxstage.stage.process import device_budget, load_stage_setup
    from voxstage.transport.shm import ShmReader, ShmWriter, sweep_dead_regions

    allowed = _allowed_talkers(args)
    # fp32 by default on every device: the decoder's Snake activations and long conv stacks are where
    # half precision audibly degrades audio, and the codec is small next to the talker.
    config, device, dtype, source = load_stage_setup(args, log, cuda_default="float32", role="codec")
    dtype = _family_dtype(config, source, args.dtype, dtype)
    link = getattr(args, "link_tls", None)  # read by run_stage (voxstage.stage.process)
    if family(source.family).duplex:
        return _build_duplex(config, device, dtype, source, allowed, link)
    stage = config.codec
    runtime = load_codec(source, device=device, dtype=dtype, max_streams=stage.max_num_seqs, config=config)
    budget = device_budget(device, stage.gpu_memory_utilization, "codec")
    if budget is not None:
        # The pool is already allocated (it is part of what memory_allocated measured): check the total.
        state = 2 * stage.max_num_seqs * runtime.state_bytes_per_stream
        budget = dataclasses.replace(budget, weights=budget.weights - state)
        # Voice states (allocated as voices are first used) are slot states too, at most this many bytes.
        per_voice = runtime.state_bytes_per_stream
        voices = 0
        if runtime.decoder_snapshots:
            voices = min(stage.codec_voice_state_bytes, stage.codec_voice_state_entries * per_voice)
        budget.require(
            state + voices,
            f"codec stream state (2 x max_num_seqs {stage.max_num_seqs} slots) and voice states "
            f"(codec_voice_state_*, {voices} B at most)",
            "lower max_num_seqs or codec_voice_state_bytes, or raise gpu_memory_utilization",
        )
        log.info(
            "codec: memory budget %s; stream state %.2f GiB, voice states %.2f GiB at most",
            budget.describe(), state / (1 << 30), voices / (1 << 30),
        )  # fmt: skip
    engine = build_engine(config, runtime, device)
    worker = CodecWorker(runtime, engine)
    sweep_dead_regions()
    writer = ShmWriter(threshold_bytes=config.stream.shm_threshold_bytes) if config.shared_memory else None
    reader = ShmReader() if config.shared_memory else None
    pool = TalkerPool(reader, allowed=allowed, tls=link)
    plan, left = config.chunk_plan, engine.left_context
    servicer = CodecServicer(worker, plan=plan, stream_config=config.stream, shm_writer=writer, pool=pool)
    log.info(
        "codec: %s (%s) on %s/%s: %d streams, chunks %d then %s%d frames, %s, %s, %s, %s, voice clone %s, "
        "shm %s",
        runtime.model, runtime.family, device, str(dtype).removeprefix("torch."), stage.max_num_seqs,
        plan.initial_frames, "growing to " if plan.ramp else "", plan.steady_frames,
        f"overlap+crop behind {left} frames" if left else "exact stateful decode",
        f"CUDA graphs for {engine.frame_buckets} frames" if engine.decode_fn else "eager",
        "async scheduling" if stage.async_scheduling else "sync scheduling",
        f"deadline ticks of at most {stage.codec_tick_budget_ms:g} ms, first chunks {engine.first_chunks}"
        if engine.tick_policy == "deadline"
        else "fifo ticks",
        "on" if runtime.voice_clone else "off",
        f"above {writer.threshold_bytes} B" if writer else "off",
    )  # fmt: skip

    binding = ServiceBinding(SERVICE_NAME, servicer, stage_pb2_grpc.add_CodecServicer_to_server)
    return stage_parts("codec", binding, servicer, worker, worker.warm_up, writer, reader, budget=budget)


def tick_policy(stage: StageConfig, family_name: str, device: str) -> TickPolicy:
    """The codec's tick schedule: the deploy file's ``codec_tick_policy``, else the family's (its
    descriptor's, measured served); always ``fifo`` off a GPU."""
    from voxstage.families import family

    policy = stage.codec_tick_policy or family(family_name).codec_tick_policy
    if policy == "deadline" and device != "cuda":
        # The budget bounds device time the codec holds a GPU shared with the talker; on the CPU it would only
        # cut batches (one tiny-model row costs more than a GPU's whole 64-row call), so ticks stay whole.
        if "codec_tick_policy" in stage.model_fields_set:
            log.warning("codec: codec_tick_policy deadline bounds GPU ticks; on %s ticks are fifo", device)
        policy = "fifo"
    if policy == "fifo" and "codec_first_chunks" in stage.model_fields_set:
        log.warning("codec: codec_first_chunks ranks chunks in deadline ticks; fifo ticks take every chunk")
    return policy


def build_engine(config: DeployConfig, runtime: CodecRuntime, device: str) -> CodecEngine:
    """The codec engine of a deploy file's (non-duplex) codec stage over a loaded ``runtime``: its chunk
    schedule, CUDA-graph frame buckets and scheduling mode (``bench/codec_schedule.py`` builds its engines
    here too). Graphs are captured later, by the worker's warm-up."""
    from services.codec.calls import DecodeCalls
    from services.codec.engine import ChunkSchedule, CodecEngine
    from voxstage.chunking import chunk_sizes

    stage = config.codec
    plan = config.chunk_plan
    left = plan.left_context_frames if plan.overlap_crop else 0
    policy = tick_policy(stage, runtime.family, device)
    decode_fn: DecodeCalls | None = None
    urgent_fn: DecodeCalls | None = None
    buckets: tuple[int, ...] = ()
    if device == "cuda" and not stage.enforce_eager:
        from services.codec.graphs import GraphedDecode

        # cudnn.benchmark is left off: on the H200 (2026-12-01) it made the codec's capture of 81 graphs take
        # 233 s instead of 24 s (every bucket shape timed), for a gain nobody has measured yet (issue 14).
        # Chunks are padded up to the next bucket; the chunk sizes in force always get one of their own.
        sizes = config.stream.decode_cudagraph_capture_sizes or []
        chunks = chunk_sizes(plan.initial_frames, plan.steady_frames, plan.ramp)
        # Overlap+crop decodes a chunk behind up to `left` frames of context: its steady windows get graphs.
        buckets = tuple(sorted({*sizes, *chunks, *(c + left for c in chunks if left)}))

        def graphed() -> GraphedDecode:
            # Capture runs use the pool's scratch half, which holds max_num_seqs slots; larger batch
            # buckets (rare: more streams due in one tick than that) decode eagerly.
            return GraphedDecode(
                runtime.decoder,
                num_groups=runtime.num_groups,
                max_batch=stage.max_num_seqs,
                frame_buckets=buckets,
                device=device,
            )

        decode_fn = graphed()
        if stage.codec_urgent_lane_ms is not None:
            # Two decodes running at once cannot share static inputs or a memory pool: the lane's own graphs.
            urgent_fn = graphed()
    kw: dict[str, Any] = {}
    engine_type: type[CodecEngine] = CodecEngine
    if stage.codec_urgent_lane_ms is not None:
        from services.codec.lanes import LanedCodecEngine

        if device != "cuda":
            log.warning("codec: codec_urgent_lane_ms: on %s there is no CUDA stream priority; the lanes "
                        "take turns", device)  # fmt: skip
        engine_type = LanedCodecEngine
        kw = {"urgent_calls": urgent_fn, "urgent_budget_s": stage.codec_urgent_lane_ms / 1e3}
    engine = engine_type(
        runtime.decoder,
        max_streams=stage.max_num_seqs,
        schedule=ChunkSchedule(
            plan.initial_frames, plan.steady_frames, max(100, plan.steady_frames), ramp=plan.ramp
        ),
        num_groups=runtime.num_groups,
        device=device,
        decode_fn=decode_fn,
        frame_buckets=buckets,
        sample_rate=runtime.sample_rate,
        codebook_size=runtime.codebook_size,
        left_context=left,
        async_scheduling=stage.async_scheduling,
        tick_policy=policy,
        tick_budget_s=stage.codec_tick_budget_ms / 1e3,
        first_chunks=stage.codec_first_chunks,
        # Half the consumers' stall timeout (connector_get_max_wait x connector_get_sleep_s): a ready chunk
        # never waits long enough for the gateway to take a healthy codec for a stalled one.
        max_wait_s=config.stream.stall_timeout_s / 2,
        voice_states=_voice_states(config, runtime, left),
        **kw,
    )
    return engine


def _voice_states(config: DeployConfig, runtime: CodecRuntime, left_context: int) -> VoiceStateCache | None:
    """The cache of voice-library voices' decoder states, when the family's pool can snapshot its slots, the
    decode is stateful and the deploy file leaves it on."""
    from services.codec.voice_states import VoiceStateCache

    stage = config.codec
    size, entries = stage.codec_voice_state_bytes, stage.codec_voice_state_entries
    if not (runtime.decoder_snapshots and size and entries):
        return None
    if left_context:
        if {"codec_voice_state_bytes", "codec_voice_state_entries"} & stage.model_fields_set:
            log.warning("codec: codec_voice_state_* keep decoder states; overlap+crop decoding has none")
        return None
    return VoiceStateCache(size, entries)


def _family_dtype(config: DeployConfig, source: ModelSource, flag: str, dtype: Any) -> Any:
    """A family whose descriptor names a ``codec_dtype_key`` takes its codec's compute dtype from that deploy
    key unless ``--dtype`` names one; other families never read it (the config checks warn about it)."""
    import torch

    from voxstage.families import family

    key = family(source.family).codec_dtype_key
    chosen = None if key is None else config.stream.family_setting(key)
    if chosen is None:
        return dtype
    if flag != "auto":
        log.info("codec: --dtype %s overrides %s %s", flag, key, chosen)
        return dtype
    return getattr(torch, chosen)


def _build_duplex(
    config: DeployConfig,
    device: str,
    dtype: Any,
    source: ModelSource,
    allowed: frozenset[str] | None,
    link: LinkTls | None,
) -> StageParts:
    """A duplex family's codec (PersonaPlex: Mimi): sessions on the 80 ms clock, one batched encode per tick
    and one batched decode per talker step (docs/protocol.md §11)."""
    from services.codec.duplex.engine import DuplexCodecConfig, DuplexCodecEngine
    from services.codec.duplex.worker import DuplexCodecWorker
    from services.codec.models import load_duplex_codec
    from services.codec.servicer import SERVICE_NAME, CodecServicer
    from services.codec.upstream import TalkerPool
    from voxstage import duplex as duplex_frame
    from voxstage.internal.v1 import stage_pb2_grpc
    from voxstage.server import ServiceBinding
    from voxstage.stage.process import device_budget
    from voxstage.transport.shm import ShmReader, ShmWriter, sweep_dead_regions

    stage = config.codec
    sessions = stage.max_num_seqs
    runtime = load_duplex_codec(source, device=device, dtype=dtype, max_sessions=sessions)
    frame = (runtime.sample_rate, runtime.samples_per_frame)
    if frame != (duplex_frame.SAMPLE_RATE, duplex_frame.FRAME_SAMPLES):
        raise StageStartError(
            f"codec: {runtime.model} runs at {frame[0]} Hz x {frame[1]} samples per frame; duplex sessions "
            f"need {duplex_frame.SAMPLE_RATE} Hz x {duplex_frame.FRAME_SAMPLES} (voxstage.duplex)"
        )
    budget = device_budget(device, stage.gpu_memory_utilization, "codec")
    if budget is not None:
        # The pool is already allocated (it is part of what memory_allocated measured): check the total.
        state = (sessions + 1) * runtime.state_bytes_per_stream
        budget = dataclasses.replace(budget, weights=budget.weights - state)
        budget.require(
            state,
            f"codec session state (max_num_seqs {sessions} sessions + 1 voice-recording slot)",
            "lower max_num_seqs or raise gpu_memory_utilization",
        )
        log.info("codec: memory budget %s; session state %.2f GiB", budget.describe(), state / (1 << 30))
    if stage.async_scheduling:
        # A duplex tick answers its own talker step, so there is no next batch to launch ahead of it.
        log.warning("codec: async_scheduling has no effect on duplex sessions (each decode is awaited)")
    calls = None
    graphed = device == "cuda" and not stage.enforce_eager
    if graphed:
        from services.codec.duplex.graphs import GraphedDuplexCalls

        # Captured for every batch bucket by the warm-up, before the stage reports SERVING.
        calls = GraphedDuplexCalls(runtime.codec, max_batch=sessions, device=device)
    jitter = max(runtime.samples_per_frame, round(config.duplex.jitter_buffer_s * runtime.sample_rate))
    engine = DuplexCodecEngine(
        runtime.codec,
        DuplexCodecConfig(max_sessions=sessions, jitter_samples=jitter),
        calls=calls,
        device=device,
    )
    worker = DuplexCodecWorker(runtime, engine)
    sweep_dead_regions()
    writer = ShmWriter(threshold_bytes=config.stream.shm_threshold_bytes) if config.shared_memory else None
    reader = ShmReader() if config.shared_memory else None
    pool = TalkerPool(reader, allowed=allowed, tls=link)
    servicer = CodecServicer(
        worker, plan=config.chunk_plan, stream_config=config.stream, shm_writer=writer, pool=pool
    )
    log.info(
        "codec: %s (%s, duplex) on %s/%s: %d sessions, %.2f s jitter buffer, %s, shm %s; the chunk "
        "keys (codec_chunk_frames, initial_codec_chunk_frames, codec_left_context_frames) have no effect "
        "on duplex sessions (one frame per tick)",
        runtime.model, runtime.family, device, str(dtype).removeprefix("torch."), sessions,
        jitter / runtime.sample_rate, "CUDA graphs per batch bucket" if graphed else "eager",
        f"above {writer.threshold_bytes} B" if writer else "off",
    )  # fmt: skip

    binding = ServiceBinding(SERVICE_NAME, servicer, stage_pb2_grpc.add_CodecServicer_to_server)
    return stage_parts("codec", binding, servicer, worker, worker.warm_up, writer, reader, budget=budget)
