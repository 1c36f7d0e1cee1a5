"""Human-readable renderings of an effective deploy config: a one-line summary and a full description.

Functions over ``DeployConfig`` rather than its methods, so the dependency runs one way (describe -> deploy)
and the model module stays free of presentation code. ``voxstage validate-config`` prints both.
"""

from __future__ import annotations

from typing import Any

import yaml

from voxstage.config.deploy import DeployConfig


def _seconds(value: float) -> float:
    # 3000 x 0.01 is 30.000000000000004 in binary floating point; print what the operator wrote.
    return round(value, 6)


def _ids(ids: tuple[int, ...]) -> str:
    return ",".join(str(i) for i in ids)


def summary(cfg: DeployConfig) -> str:
    """One line: roles, slots, memory, chunking, timeouts, transport, platform."""
    talker, codec, stream, chunks = cfg.talker, cfg.codec, cfg.stream, cfg.chunk_plan
    parts = [
        f"talker stage {talker.stage_id}: {talker.max_num_seqs} slots, "
        f"{talker.gpu_memory_utilization:g} of GPU {_ids(talker.device_ids)}",
        f"codec stage {codec.stage_id}: {codec.max_num_seqs} streams, "
        f"{codec.gpu_memory_utilization:g} of GPU {_ids(codec.device_ids)}",
    ]
    if chunks.whole_take:
        parts.append("whole-take decode (async_chunk: false)")
    else:
        parts.append(
            f"chunks {chunks.initial_frames} then {'doubling up to ' if chunks.ramp else ''}"
            f"{chunks.steady_frames} frames"
            f" (left context {chunks.left_context_frames})"
        )
    parts.append(
        f"timeouts {_seconds(stream.first_chunk_timeout_s):g} s first chunk / "
        f"{_seconds(stream.stall_timeout_s):g} s stall"
    )
    parts.append(f"shm above {stream.shm_threshold_bytes} B" if cfg.shared_memory else "inline gRPC only")
    if cfg.duplex_max_sessions is not None:
        parts.append(f"duplex, up to {cfg.duplex_max_sessions} sessions")
    if cfg.pipeline is not None:
        parts.append(f"pipeline {cfg.pipeline}")
    overlay = " + overlay" if cfg.platform in cfg.platforms else ""
    parts.append(f"platform {cfg.platform or 'unset'}{overlay}")
    return "; ".join(parts)


def _derived(cfg: DeployConfig) -> dict[str, Any]:
    stream, chunks = cfg.stream, cfg.chunk_plan
    model_path = cfg.model_path()
    return {
        "stages": [
            {
                "stage_id": stage.stage_id,
                "role": str(stage.role),
                "device_ids": list(stage.device_ids),
                "max_num_batched_tokens": stage.batched_token_budget,
                "max_model_len": stage.max_model_len
                if stage.max_model_len is not None
                else "checkpoint limit",
                "greedy": stage.default_sampling_params.greedy,
            }
            for stage in cfg.stages
        ],
        "stream": {
            "connector": cfg.stream_connector_name or "none (inline gRPC)",
            "shared_memory": cfg.shared_memory,
            "first_chunk_timeout_s": _seconds(stream.first_chunk_timeout_s),
            "stall_timeout_s": _seconds(stream.stall_timeout_s),
            "chunk_plan": {
                "initial_frames": chunks.initial_frames,
                "steady_frames": chunks.steady_frames,
                "left_context_frames": chunks.left_context_frames,
                "whole_take": chunks.whole_take,
                "ramp": chunks.ramp,
            },
        },
        "admission_limit": cfg.admission_limit,
        "duplex_max_sessions": cfg.duplex_max_sessions,
        "model_path": str(model_path) if model_path is not None else None,
    }


def describe(cfg: DeployConfig) -> str:
    """The effective config (every key, defaults filled in) plus the values derived from it."""
    platform = cfg.platform or "unset"
    applied = f"platforms.{platform} applied" if cfg.platform in cfg.platforms else "no overlay for it"
    lines = [f"# effective deploy config of {cfg.source}", f"# platform: {platform} ({applied})"]
    lines += [f"# --set {text}" for text in cfg.overrides]
    body = cfg.model_dump(mode="json", exclude={"platforms"})
    body["platforms_in_file"] = sorted(cfg.platforms)
    lines.append(yaml.safe_dump(body, sort_keys=False, default_flow_style=False, width=100).rstrip())
    lines.append("# derived from the keys above")
    lines.append(
        yaml.safe_dump(
            {"derived": _derived(cfg)}, sort_keys=False, default_flow_style=False, width=100
        ).rstrip()
    )
    if cfg.warnings:
        lines.append("# warnings")
        lines += [f"#   {w.path}: {w.message}" for w in cfg.warnings]
    return "\n".join(lines) + "\n"
