"""Checks that span more than one key: the stage graph, device budgets, prefill, duplex and no-op settings.

Single-key rules live on the models as field constraints; what is here needs the whole file. Every finding
names the key it is about, so an operator can go straight to the line. Warnings are for settings that are
valid but do nothing in this deploy: vllm-omni ignored such keys silently, and that is what we avoid.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Protocol

from voxstage import families
from voxstage.config.connector import ConnectorConfig
from voxstage.config.duplex import DuplexSessionConfig
from voxstage.config.errors import Issue
from voxstage.config.gateway import GatewayConfig
from voxstage.config.stage import CODEC_STAGE_ID, ROLE_BY_STAGE_ID, TALKER_STAGE_ID, StageConfig


class DeployView(Protocol):
    """What the checks read of a deploy config; ``DeployConfig`` satisfies it structurally.

    A protocol rather than ``DeployConfig`` itself because deploy.py calls these checks from its validator:
    naming the class here would make the two modules import each other. Members are read-only properties
    so that pydantic fields and ``DeployConfig``'s own properties both match, and the collection types are
    the read-only ``Mapping``/``Sequence`` because the checks never mutate the config.
    """

    @property
    def pipeline(self) -> str | None: ...
    @property
    def async_chunk(self) -> bool: ...
    @property
    def enable_chunked_prefill(self) -> bool: ...
    @property
    def session_mode(self) -> str: ...
    @property
    def duplex_session(self) -> DuplexSessionConfig | None: ...
    @property
    def connectors(self) -> Mapping[str, ConnectorConfig]: ...
    @property
    def stages(self) -> Sequence[StageConfig]: ...
    @property
    def gateway(self) -> GatewayConfig: ...
    @property
    def stream_connector_name(self) -> str | None: ...
    @property
    def duplex_max_sessions(self) -> int | None: ...


_EDGE_KEY = {
    "output_connectors": re.compile(r"^to_stage_(\d+)$"),
    "input_connectors": re.compile(r"^from_stage_(\d+)$"),
}
_EDGE_SPELLING = {"output_connectors": "to_stage_<id>", "input_connectors": "from_stage_<id>"}
# Sums of fractions such as 0.7 + 0.3 are not exact in binary floating point.
_EPS = 1e-9


def _error(loc: tuple[str | int, ...], message: str) -> Issue:
    return Issue(loc=loc, message=message)


def _warning(loc: tuple[str | int, ...], message: str) -> Issue:
    return Issue(loc=loc, message=message, severity="warning")


# Keys one stage reads, and why: set on the other stage they are errors naming the owner.
CODEC_ONLY_KEYS: Mapping[str, str] = {
    "codec_tick_policy": "it schedules the codec's decodes",
    "codec_tick_budget_ms": "it schedules the codec's decodes",
    "codec_first_chunks": "it schedules the codec's decodes",
    "codec_urgent_lane_ms": "it schedules the codec's decodes",
    "codec_voice_state_bytes": "it bounds the codec's decoder states of voice-library voices; the talker's "
    "prompt cache is voice_cache_*",
    "codec_voice_state_entries": "it bounds the codec's decoder states of voice-library voices; the talker's "
    "prompt cache is voice_cache_*",
}
PACING_KEYS = ("pace_realtime_x", "pace_ahead_s", "pace_ride_s", "pace_from_streams")
TALKER_ONLY_KEYS: Mapping[str, str] = {
    **dict.fromkeys(PACING_KEYS, "it paces the talker's frame steps"),
    "voice_cache_bytes": "it bounds the talker's cache of voice prompts; the codec's decoder states are "
    "codec_voice_state_*",
    "voice_cache_entries": "it bounds the talker's cache of voice prompts; the codec's decoder states are "
    "codec_voice_state_*",
}


def _owned_elsewhere(stage: StageConfig, i: int, keys: Mapping[str, str], owner: str) -> list[Issue]:
    """An error per key of ``keys`` that this stage sets though ``owner`` reads it."""
    return [
        _error(("stages", i, key), f"belongs to {owner}: {why}")
        for key, why in keys.items()
        if key in stage.model_fields_set
    ]


def _inert_in_duplex(stage: StageConfig, i: int, keys: Sequence[str], why: str) -> list[Issue]:
    """A warning per key of ``keys`` that this stage sets though duplex sessions never read it."""
    return [
        _warning(("stages", i, key), f"has no effect on duplex sessions: {why}")
        for key in keys
        if key in stage.model_fields_set
    ]


def _index_of(cfg: DeployView, stage_id: int) -> int | None:
    for i, stage in enumerate(cfg.stages):
        if stage.stage_id == stage_id:
            return i
    return None


def check_stage_ids(cfg: DeployView) -> list[Issue]:
    out: list[Issue] = []
    first: dict[int, int] = {}
    for i, stage in enumerate(cfg.stages):
        if stage.stage_id in first:
            out.append(
                _error(
                    ("stages", i, "stage_id"),
                    f"duplicate stage_id {stage.stage_id} (also stages[{first[stage.stage_id]}])",
                )
            )
            continue
        first[stage.stage_id] = i
        if stage.stage_id not in ROLE_BY_STAGE_ID:
            out.append(
                _error(
                    ("stages", i, "stage_id"),
                    f"stage_id {stage.stage_id} has no role: voxstage runs stage {TALKER_STAGE_ID} "
                    f"(talker) and stage {CODEC_STAGE_ID} (codec)",
                )
            )
    if TALKER_STAGE_ID not in first:
        out.append(_error(("stages",), f"no talker stage: add a stage with stage_id {TALKER_STAGE_ID}"))
    if CODEC_STAGE_ID not in first:
        out.append(_error(("stages",), f"no codec stage: add a stage with stage_id {CODEC_STAGE_ID}"))
    return out


def check_edges(cfg: DeployView) -> list[Issue]:
    """Each edge names an existing stage and connector, goes talker -> codec, and both ends agree."""
    out: list[Issue] = []
    ids = {stage.stage_id for stage in cfg.stages}
    sends: dict[int, tuple[int, str]] = {}  # source stage id -> (list index, connector)
    receives: dict[int, tuple[int, str]] = {}  # sink stage id -> (list index, connector)
    for i, stage in enumerate(cfg.stages):
        for side in ("output_connectors", "input_connectors"):
            for key, connector in getattr(stage, side).items():
                loc = ("stages", i, side, key)
                match = _EDGE_KEY[side].match(key)
                if match is None:
                    out.append(_error(loc, f"edge keys in {side} are spelled {_EDGE_SPELLING[side]}"))
                    continue
                other = int(match.group(1))
                src, dst = (stage.stage_id, other) if side == "output_connectors" else (other, stage.stage_id)
                if other not in ids:
                    out.append(
                        _error(
                            loc,
                            f"edge {src} -> {dst} refers to stage {other}, but no stage has stage_id {other}",
                        )
                    )
                    continue
                if connector not in cfg.connectors:
                    known = ", ".join(sorted(cfg.connectors)) or "none are defined"
                    out.append(_error(loc, f"unknown connector {connector!r} (connectors: {known})"))
                    continue
                if (src, dst) != (TALKER_STAGE_ID, CODEC_STAGE_ID):
                    out.append(
                        _error(
                            loc,
                            f"edge {src} -> {dst} is not supported: the only edge is talker "
                            f"(stage {TALKER_STAGE_ID}) -> codec (stage {CODEC_STAGE_ID}); its gRPC "
                            "stream already carries both directions",
                        )
                    )
                    continue
                (sends if side == "output_connectors" else receives)[stage.stage_id] = (i, connector)
    sent = sends.get(TALKER_STAGE_ID)
    got = receives.get(CODEC_STAGE_ID)
    if sent and got and sent[1] != got[1]:
        out.append(
            _error(
                ("stages", got[0], "input_connectors", f"from_stage_{TALKER_STAGE_ID}"),
                f"stage {TALKER_STAGE_ID} sends over {sent[1]!r} but stage {CODEC_STAGE_ID} "
                f"receives over {got[1]!r}",
            )
        )
    elif sent and not got and (j := _index_of(cfg, CODEC_STAGE_ID)) is not None:
        out.append(
            _error(
                ("stages", j, "input_connectors"),
                f"missing from_stage_{TALKER_STAGE_ID}: {sent[1]!r}; stage {TALKER_STAGE_ID} declares "
                f"to_stage_{CODEC_STAGE_ID} and both ends of an edge must name the same connector",
            )
        )
    elif got and not sent and (j := _index_of(cfg, TALKER_STAGE_ID)) is not None:
        out.append(
            _error(
                ("stages", j, "output_connectors"),
                f"missing to_stage_{CODEC_STAGE_ID}: {got[1]!r}; stage {CODEC_STAGE_ID} declares "
                f"from_stage_{TALKER_STAGE_ID} and both ends of an edge must name the same connector",
            )
        )
    used = {connector for _, connector in (*sends.values(), *receives.values())}
    for name in cfg.connectors:
        if name not in used:
            out.append(
                _warning(("connectors", name), "not used by any stage edge, so none of its settings apply")
            )
    return out


def check_devices(cfg: DeployView, *, platform: str | None = None) -> list[Issue]:
    out: list[Issue] = []
    # Every replica is its own process with its own budget: a GPU's sum counts each replica on it.
    users: dict[int, list[tuple[int, StageConfig]]] = defaultdict(list)
    for i, stage in enumerate(cfg.stages):
        if stage.replica_devices is not None and "devices" in stage.model_fields_set:
            out.append(_warning(("stages", i, "devices"), "no effect: replica_devices places every replica"))
        for devices in stage.replica_device_lists:
            for device in (int(part) for part in devices.split(",")):
                users[device].append((i, stage))
        for devices in dict.fromkeys(stage.replica_device_lists):  # once per distinct list
            ids = [int(part) for part in devices.split(",")]
            if len(ids) > 1:
                out.append(
                    _warning(
                        ("stages", i, "devices" if stage.replica_devices is None else "replica_devices"),
                        f"lists {len(ids)} GPUs, but a stage runs on one GPU (no tensor "
                        f"parallelism): it uses GPU {ids[0]} and the others are only made "
                        "visible to the process",
                    )
                )
    for device, sharing in sorted(users.items()):
        total = sum(stage.gpu_memory_utilization for _, stage in sharing)
        if total > 1.0 + _EPS:
            # Point at the biggest share: that is the value most likely raised by mistake.
            worst = max(sharing, key=lambda entry: entry[1].gpu_memory_utilization)
            parts = ", ".join(f"stage {s.stage_id} ({s.gpu_memory_utilization:g})" for _, s in sharing)
            loc = ("stages", worst[0], "gpu_memory_utilization")
            why = f"GPU {device} is shared by {parts}: gpu_memory_utilization sums to {total:g}"
            if platform == "cpu":
                # A CPU process has no device budget: the fraction sizes nothing there, so replicas on CPU
                # run whatever it says. Still say it, as the same file would not start on a GPU.
                out.append(_warning(loc, f"{why}; not enforced on cpu, but on a GPU this deploy is refused"))
            else:
                out.append(_error(loc, f"{why}, more than the whole device"))
    return out


def _family_may_pace(cfg: DeployView) -> bool:
    """Whether the model family may pace its talker by default (on a GPU, with neither pacing key set): a
    deploy file without `pipeline` learns its family from the model, so the talker's start decides."""
    fam = None if cfg.pipeline is None else families.find(cfg.pipeline)
    return fam is None or fam.talker_pacing is not None


def check_stage_settings(cfg: DeployView) -> list[Issue]:
    out: list[Issue] = []
    for i, stage in enumerate(cfg.stages):
        if stage.stage_id == TALKER_STAGE_ID:
            out += _owned_elsewhere(stage, i, CODEC_ONLY_KEYS, f"the codec stage (stage_id {CODEC_STAGE_ID})")
            if cfg.session_mode == "duplex":
                out += _inert_in_duplex(stage, i, PACING_KEYS, "their talker steps once per user frame")
            elif stage.pace_ride_s is not None and stage.pace_ahead_s is None and not _family_may_pace(cfg):
                out.append(
                    _error(
                        ("stages", i, "pace_ride_s"),
                        "needs pace_ahead_s: a stream rides along in steps only once it is held",
                    )
                )
            if not cfg.enable_chunked_prefill:
                if stage.max_model_len is None:
                    out.append(
                        _error(
                            ("stages", i, "max_model_len"),
                            "must be set when enable_chunked_prefill is false: a prompt is then "
                            "prefilled in one tick, and max_num_batched_tokens is checked against "
                            "this length",
                        )
                    )
                elif stage.batched_token_budget < stage.max_model_len:
                    shown = "" if stage.max_num_batched_tokens is not None else " (the default)"
                    out.append(
                        _error(
                            ("stages", i, "max_num_batched_tokens"),
                            f"is {stage.batched_token_budget}{shown} but must be >= max_model_len "
                            f"({stage.max_model_len}): enable_chunked_prefill: false prefills a "
                            "whole prompt in one tick",
                        )
                    )
            fam = None if cfg.pipeline is None else families.find(cfg.pipeline)
            if fam is not None and fam.limits.no_prefix_caching and stage.enable_prefix_caching:
                out.append(
                    _error(
                        ("stages", i, "enable_prefix_caching"),
                        f"must be false for {fam.name}: {fam.limits.no_prefix_caching}",
                    )
                )
        elif stage.stage_id == CODEC_STAGE_ID:
            if cfg.session_mode == "duplex":
                voice = ("codec_voice_state_bytes", "codec_voice_state_entries")
                out += _inert_in_duplex(stage, i, voice, "their codec decodes no reference prefix")
                ticks = (
                    "codec_tick_policy",
                    "codec_tick_budget_ms",
                    "codec_first_chunks",
                    "codec_urgent_lane_ms",
                )
                out += _inert_in_duplex(
                    stage, i, ticks, "their codec decodes one frame per session per talker step"
                )
            elif stage.codec_urgent_lane_ms is not None and not stage.async_scheduling:
                out.append(
                    _error(
                        ("stages", i, "codec_urgent_lane_ms"),
                        "needs async_scheduling: true: the two lanes' decodes are collected as they "
                        "finish, never waited for",
                    )
                )
            if stage.segments is not None:
                out.append(
                    _error(
                        ("stages", i, "segments"),
                        f"belongs to the talker stage (stage_id {TALKER_STAGE_ID}): the talker cuts "
                        "text into segments",
                    )
                )
            if stage.subtalker_sampling_params is not None:
                out.append(
                    _error(
                        ("stages", i, "subtalker_sampling_params"),
                        f"belongs to the talker stage (stage_id {TALKER_STAGE_ID}); the codec does "
                        "not sample",
                    )
                )
            if stage.enable_prefix_caching:
                out.append(
                    _warning(
                        ("stages", i, "enable_prefix_caching"),
                        "has no effect on the codec stage: it decodes codec frames and keeps no "
                        "prompt KV cache",
                    )
                )
            if stage.kv_cache_dtype != "auto":
                out.append(
                    _error(
                        ("stages", i, "kv_cache_dtype"),
                        f"belongs to the talker stage (stage_id {TALKER_STAGE_ID}): the codec's caches "
                        "are small, per-session state kept in the model dtype",
                    )
                )
            out += _owned_elsewhere(
                stage, i, TALKER_ONLY_KEYS, f"the talker stage (stage_id {TALKER_STAGE_ID})"
            )
    return out


def check_session(cfg: DeployView) -> list[Issue]:
    out: list[Issue] = []
    gw = cfg.gateway
    if cfg.session_mode != "duplex":
        for key in ("duplex_idle_timeout_s", "duplex_max_session_s", "duplex_send_timeout_s"):
            if key in gw.model_fields_set:
                out.append(
                    _warning(
                        ("gateway", key),
                        f"has no effect: session_mode is {cfg.session_mode!r}, so no duplex session runs",
                    )
                )
        if cfg.duplex_session is not None:
            out.append(
                _error(
                    ("duplex_session",),
                    f"is only valid with session_mode: duplex (session_mode is {cfg.session_mode!r})",
                )
            )
        return out
    if not cfg.async_chunk:
        out.append(
            _error(
                ("async_chunk",),
                "must be true with session_mode: duplex: a duplex tick streams every 80 ms frame",
            )
        )
    fam = None if cfg.pipeline is None else families.find(cfg.pipeline)
    if fam is not None and not fam.duplex:
        duplex = ", ".join(f.name for f in families.families() if f.duplex)
        out.append(
            _error(
                ("session_mode",),
                f"duplex needs a full-duplex model family ({duplex}); pipeline is {cfg.pipeline!r}",
            )
        )
    if gw.duplex_idle_timeout_s > gw.duplex_max_session_s:
        out.append(
            _warning(
                ("gateway", "duplex_idle_timeout_s"),
                f"has no effect: it is longer than gateway.duplex_max_session_s "
                f"({gw.duplex_max_session_s:g} s), which closes every session first",
            )
        )
    sessions = cfg.duplex_max_sessions
    for stage_id, what in ((TALKER_STAGE_ID, "talker slot"), (CODEC_STAGE_ID, "codec stream")):
        index = _index_of(cfg, stage_id)
        if index is None or sessions is None:
            continue
        limit = cfg.stages[index].max_num_seqs
        if sessions > limit:
            out.append(
                _error(
                    ("duplex_session", "max_sessions"),
                    f"is {sessions} but each live session holds one {what} and "
                    f"stages[{index}].max_num_seqs is {limit}",
                )
            )
    return out


def check_concurrency(cfg: DeployView) -> list[Issue]:
    """Each request holds one talker slot and one codec stream, so the smaller pool caps the deploy."""
    talker_index, codec_index = _index_of(cfg, TALKER_STAGE_ID), _index_of(cfg, CODEC_STAGE_ID)
    if talker_index is None or codec_index is None:
        return []
    slots, streams = cfg.stages[talker_index].max_num_seqs, cfg.stages[codec_index].max_num_seqs
    if streams >= slots:
        return []
    return [
        _warning(
            ("stages", codec_index, "max_num_seqs"),
            f"is {streams}, fewer codec streams than the talker's {slots} slots: every request holds one of "
            f"each, so at most {streams} run at once and {slots - streams} talker slots stay idle",
        )
    ]


def check_stream(cfg: DeployView) -> list[Issue]:
    """No-op warnings for the talker -> codec stream's chunk and codec keys."""
    out: list[Issue] = []
    name = cfg.stream_connector_name
    if name is None or name not in cfg.connectors:
        return out
    extra = cfg.connectors[name].extra
    loc = ("connectors", name, "extra")
    codec_index = _index_of(cfg, CODEC_STAGE_ID)
    if extra.decode_cudagraph_capture_sizes is not None and codec_index is not None:
        if cfg.stages[codec_index].enforce_eager:
            out.append(
                _warning(
                    (*loc, "decode_cudagraph_capture_sizes"),
                    f"has no effect: the codec stage (stages[{codec_index}]) sets enforce_eager: "
                    "true, so nothing is captured",
                )
            )
    for owner in families.families():
        key = owner.codec_dtype_key
        if key and extra.family_setting(key) is not None and cfg.pipeline not in (None, *owner.names):
            out.append(
                _warning(
                    (*loc, key),
                    f"has no effect: only the {owner.name} codec reads it (pipeline is {cfg.pipeline!r})",
                )
            )
    if not cfg.async_chunk and extra.initial_codec_chunk_frames is not None:
        out.append(
            _warning(
                (*loc, "initial_codec_chunk_frames"),
                "has no effect with async_chunk: false (each take ships in one piece)",
            )
        )
    return out


def check_deploy(cfg: DeployView, *, platform: str | None = None) -> list[Issue]:
    """Every cross-key error and warning of ``cfg`` (locations relative to the file's top level);
    ``platform`` is the one being loaded (None when unknown: checked as for a GPU)."""
    return [
        *check_stage_ids(cfg),
        *check_edges(cfg),
        *check_devices(cfg, platform=platform),
        *check_stage_settings(cfg),
        *check_session(cfg),
        *check_concurrency(cfg),
        *check_stream(cfg),
    ]
