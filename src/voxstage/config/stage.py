"""Per-stage settings: ``stages[]`` and the sampling defaults nested in them.

Meanings, units and the reason for every default are in docs/configuration.md; the comments here only
explain choices the table cannot.
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from voxstage.config.base import StrictModel

# Role by stage id. voxstage runs exactly one graph, talker -> codec; the ids are those the seed files use
# (stage 0 owns the token core, stage 1 the audio edge), so the ids double as the role declaration.
TALKER_STAGE_ID = 0
CODEC_STAGE_ID = 1

# Per-tick token budgets when max_num_batched_tokens is omitted. Talker: vLLM's chunked-prefill default,
# small enough that a long prompt never stalls the frame step of running slots for more than a tick or two.
# Codec: counted in codec tokens (codebooks x frames); 65536 covers a 16-codebook chunk of 4096 frames, far
# above any steady chunk, so only a misconfiguration can hit it.
DEFAULT_TALKER_BATCHED_TOKENS = 2048
DEFAULT_CODEC_BATCHED_TOKENS = 65536

_DEVICES = re.compile(r"^\s*\d+\s*(,\s*\d+\s*)*$")

# kv_cache_dtype: vLLM's spellings that mean what voxstage does, and the canonical value each one reads as.
KV_CACHE_DTYPES: dict[str, str] = {"auto": "auto", "fp8": "fp8", "fp8_e4m3": "fp8"}
# vLLM spellings voxstage refuses, each with the reason (a key that is accepted must do something).
_KV_CACHE_REFUSED: dict[str, str] = {
    "fp8_e5m2": "e5m2 keeps 2 mantissa bits where e4m3 keeps 3; voxstage stores e4m3 (fp8, fp8_e4m3)",
    "fp8_inc": "is Intel Gaudi's fp8 cache; voxstage stores e4m3 (fp8, fp8_e4m3)",
    "fp8_ds_mla": "is DeepSeek MLA's latent-cache layout; these models have no MLA",
    "bfloat16": "is what auto does in a bfloat16 deploy; auto always stores the model dtype",
    "float16": "is what auto does in a float16 deploy; auto always stores the model dtype",
}


class StageRole(StrEnum):
    TALKER = "talker"
    CODEC = "codec"


ROLE_BY_STAGE_ID: dict[int, StageRole] = {TALKER_STAGE_ID: StageRole.TALKER, CODEC_STAGE_ID: StageRole.CODEC}


class SamplingParams(StrictModel):
    """Per-request sampling defaults; a request may override any of them."""

    temperature: float = Field(default=1.0, ge=0.0)
    top_k: int = -1
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    max_tokens: int | None = Field(default=None, ge=1)
    min_tokens: int = Field(default=0, ge=0)
    seed: int | None = None
    repetition_penalty: float = Field(default=1.0, gt=0.0)
    do_sample: bool | None = None

    @field_validator("top_k")
    @classmethod
    def _top_k(cls, value: int) -> int:
        # 0 means "off" in some stacks and "nothing allowed" in others; one spelling for "off" ends the doubt.
        if value == 0 or value < -1:
            raise ValueError(f"must be -1 (off) or a positive integer, got {value}")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> SamplingParams:
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise ValueError(f"min_tokens ({self.min_tokens}) must not exceed max_tokens ({self.max_tokens})")
        if self.do_sample is True and self.temperature == 0.0:
            raise ValueError("do_sample: true needs temperature > 0 (temperature 0 is greedy decoding)")
        return self

    @property
    def greedy(self) -> bool:
        """True when decoding takes the arg-max token (explicitly, or because nothing is left to sample)."""
        if self.do_sample is not None:
            return not self.do_sample
        return self.temperature == 0.0 or self.top_k == 1


class SegmentsConfig(StrictModel):
    """voxstage: how the talker turns a streaming request's text into segments (voxstage.segments)."""

    # Start a segment's take once this many characters of it are in, before its flush, in the model's
    # streaming-text mode (families that stream text only; 0: every segment waits for its flush).
    early_start_chars: int = Field(default=16, ge=0, le=4096)
    # The per-segment frame cap from the text length; a request's explicit max_frames replaces it.
    frame_cap: bool = True
    frame_cap_floor_s: float = Field(default=3.0, gt=0.0, le=600.0)
    frame_cap_s_per_char: float = Field(default=0.15, gt=0.0, le=10.0)
    frame_cap_s_per_wide_char: float = Field(default=0.5, gt=0.0, le=10.0)


def _int_as_devices(value: Any) -> Any:
    # `devices: 0` (unquoted) and `--set stages.1.devices=1` are YAML ints; accept them as one index.
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return value


def _device_list(value: str) -> str:
    if not _DEVICES.match(value):
        raise ValueError(
            f"must be a comma-separated list of non-negative GPU indices like '0' or '0,1', got {value!r}"
        )
    ids = [int(part) for part in value.split(",")]
    if len(set(ids)) != len(ids):
        raise ValueError(f"lists a GPU index twice: {value!r}")
    return ",".join(str(i) for i in ids)


class StageConfig(StrictModel):
    """One stage process: its device slice, its engine limits and its connector edges."""

    stage_id: int = Field(ge=0)
    max_num_seqs: int = Field(default=4, ge=1)
    gpu_memory_utilization: float = Field(default=0.3, gt=0.0, le=1.0)
    enforce_eager: bool = False
    trust_remote_code: bool = False
    skip_tokenizer_init: bool = False
    enable_prefix_caching: bool = False
    async_scheduling: bool = False
    # voxstage: this stage's share of the GPU's SMs under CUDA MPS (voxstage.stage.mps); None: no cap.
    mps_active_thread_percentage: int | None = Field(default=None, ge=1, le=100)
    # voxstage, codec only: which ready chunks a tick decodes (services/codec/schedule.py) and the estimated
    # device time a deadline tick may take (docs/configuration.md gives the reasons for the defaults).
    codec_tick_policy: Literal["fifo", "deadline"] | None = None  # None: the model family's (descriptor)
    codec_tick_budget_ms: float = Field(default=20.0, gt=0.0, le=1000.0)
    # ... and under deadline, where the next chunk of a stream with no audio out yet ranks: "lead" (due since
    # it opened: before everything) or "yield" (due as if it started now: after playing streams about to
    # run dry). Which is the default waits for the H200's closed search (docs/configuration.md).
    codec_first_chunks: Literal["lead", "yield"] = "lead"
    # ... and with this set, a second lane (services/codec/lanes.py): first, prefix and ramp chunks decode on
    # a high-priority CUDA stream in ticks of at most this much estimated device time, beside the bulk ticks
    # above on a low-priority one. None: one lane. Needs async_scheduling.
    codec_urgent_lane_ms: float | None = Field(default=None, gt=0.0, le=1000.0)
    max_model_len: int | None = Field(default=None, ge=1)
    max_num_batched_tokens: int | None = Field(default=None, ge=1)
    # Talker only: the KV cache's storage, "auto" (the model dtype) or "fp8" (e4m3, per-head scales).
    kv_cache_dtype: str = "auto"
    # Talker only, text to speech (services/talker/pacing.py): under load (at least pace_from_streams
    # requests in slots) a frame step starts at most once per frame period / pace_realtime_x, and a stream
    # more than pace_ahead_s of audio ahead of real time sits steps out, which leaves the rest of a shared
    # GPU to the codec (docs/configuration.md). Unset (both it and pace_ahead_s): the model family's on a GPU
    # (its descriptor's talker_pacing), else as fast as it can; 0: as fast as it can.
    pace_realtime_x: float | None = Field(default=None, ge=0.0, le=1000.0)
    pace_ahead_s: float | None = Field(default=None, gt=0.0, le=3600.0)
    # ... but rides along, up to pace_ahead_s + pace_ride_s ahead, in a step that runs anyway: its row costs
    # the same masked, so the streams fall into step together and fewer steps run (needs pace_ahead_s;
    # unset, as far again as pace_ahead_s: services/talker/main.pacing_of).
    pace_ride_s: float | None = Field(default=None, ge=0.0, le=3600.0)
    pace_from_streams: int = Field(default=16, ge=1)
    # Talker only: ready voice prompts of voice-library voices (services/talker/voice_cache.py), bounded
    # by bytes and by entries; 0 in either turns the cache off (every request rebuilds its voice's prompt).
    voice_cache_bytes: int = Field(default=64 * 1024 * 1024, ge=0)
    voice_cache_entries: int = Field(default=256, ge=0)
    # Codec only: decoder states of voice-library voices right after their reference prefix
    # (services/codec/voice_states.py), bounded by bytes and by entries; 0 in either turns them off.
    codec_voice_state_bytes: int = Field(default=128 * 1024 * 1024, ge=0)
    codec_voice_state_entries: int = Field(default=64, ge=0)
    devices: str = "0"
    input_connectors: dict[str, str] = Field(default_factory=dict)
    output_connectors: dict[str, str] = Field(default_factory=dict)
    default_sampling_params: SamplingParams = Field(default_factory=SamplingParams)
    subtalker_sampling_params: SamplingParams | None = None
    segments: SegmentsConfig | None = None  # talker only; None: the defaults
    # voxstage serve: how many processes of this stage to start on this host, and each one's GPUs
    # (docs/configuration.md, "Replicas on one host"). Unset: one replica on `devices`.
    replicas: int | None = Field(default=None, ge=1, le=64)
    replica_devices: list[str] | None = Field(default=None, min_length=1)

    @field_validator("devices", mode="before")
    @classmethod
    def _devices_from_int(cls, value: Any) -> Any:
        return _int_as_devices(value)

    @field_validator("pace_realtime_x")
    @classmethod
    def _pace_realtime_x(cls, value: float | None) -> float | None:
        if value is not None and 0.0 < value < 1.0:
            raise ValueError(f"must be 0 (no pacing) or at least 1 (real time), got {value:g}")
        return value

    @field_validator("kv_cache_dtype")
    @classmethod
    def _kv_cache_dtype(cls, value: str) -> str:
        spelled = value.strip().lower()
        if spelled in KV_CACHE_DTYPES:
            return KV_CACHE_DTYPES[spelled]
        if spelled in _KV_CACHE_REFUSED:
            raise ValueError(f"{value!r} is not supported: it {_KV_CACHE_REFUSED[spelled]}")
        raise ValueError(f"must be one of {', '.join(KV_CACHE_DTYPES)}, got {value!r}")

    @field_validator("replica_devices", mode="before")
    @classmethod
    def _replica_devices_from_ints(cls, value: Any) -> Any:
        return [_int_as_devices(v) for v in value] if isinstance(value, list) else value

    @field_validator("devices")
    @classmethod
    def _devices_list(cls, value: str) -> str:
        return _device_list(value)

    @field_validator("replica_devices")
    @classmethod
    def _replica_device_lists(cls, value: list[str] | None) -> list[str] | None:
        return None if value is None else [_device_list(v) for v in value]

    @model_validator(mode="after")
    def _replica_count(self) -> StageConfig:
        if self.replicas is not None and self.replica_devices is not None:
            if self.replicas != len(self.replica_devices):
                raise ValueError(
                    f"replicas is {self.replicas} but replica_devices lists {len(self.replica_devices)} "
                    "entries (one per replica); set one of them"
                )
        return self

    @property
    def device_ids(self) -> tuple[int, ...]:
        return tuple(int(part) for part in self.devices.split(","))

    @property
    def replica_count(self) -> int:
        if self.replica_devices is not None:
            return len(self.replica_devices)
        return self.replicas or 1

    @property
    def replica_device_lists(self) -> list[str]:
        """Each replica's ``devices`` (what its process sees), in replica order."""
        return list(self.replica_devices or [self.devices] * self.replica_count)

    @property
    def role(self) -> StageRole | None:
        """Talker or codec; None for a stage id outside the graph (load-time validation rejects those)."""
        return ROLE_BY_STAGE_ID.get(self.stage_id)

    @property
    def batched_token_budget(self) -> int:
        """``max_num_batched_tokens`` or the role's default (talker: prompt tokens; codec: codec tokens)."""
        if self.max_num_batched_tokens is not None:
            return self.max_num_batched_tokens
        return DEFAULT_CODEC_BATCHED_TOKENS if self.role is StageRole.CODEC else DEFAULT_TALKER_BATCHED_TOKENS
