"""``connectors.<name>``: the talker -> codec stream's transport, timeouts and chunk schedule.

vllm-omni hands one untyped ``extra`` dict to the connector, the chunk producer and the codec alike, and
four of its keys are read by nobody. The file shape must stay (the seeds load unchanged), but every key is
typed here and has one owner: transport keys go to the shm fast path, ``connector_get_*`` to the stream
deadlines, the ``codec_*`` keys to the chunk schedule and the codec engine.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, create_model, field_validator, model_validator

from voxstage.chunking import next_boundary
from voxstage.config.base import StrictModel
from voxstage.families import families

# Connector kinds voxstage implements. Cross-host streams need none: they are plain inline gRPC, which is why
# vllm-omni's Mooncake/NIXL/Yuanrong connectors have no counterpart here.
CONNECTOR_KINDS: tuple[str, ...] = ("SharedMemoryConnector",)

CodecDType = Literal["float32", "bfloat16", "float16"]


class ConnectorExtraFields(StrictModel):
    """The typed ``extra:`` block of a connector (``ConnectorExtra`` adds the keys families own)."""

    shm_threshold_bytes: int = Field(default=65536, ge=0)
    codec_streaming: bool = True
    connector_get_sleep_s: float = Field(default=0.01, gt=0.0)
    connector_get_max_wait_first_chunk: int = Field(default=3000, ge=1)
    connector_get_max_wait: int = Field(default=300, ge=1)
    codec_chunk_frames: int = Field(default=25, ge=1)
    codec_left_context_frames: int = Field(default=0, ge=0)
    initial_codec_chunk_frames: int | None = Field(default=None, ge=1)
    # voxstage: chunks double from the first one up to codec_chunk_frames (voxstage.chunking says why).
    codec_chunk_ramp: bool = True
    # voxstage: "stateful" (exact per-stream streaming state) or "overlap_crop" (vllm-omni's way: each chunk
    # is decoded afresh behind codec_left_context_frames of already-decoded frames whose audio is cropped).
    codec_decode: Literal["stateful", "overlap_crop"] = "stateful"
    decode_cudagraph_capture_sizes: list[int] | None = None

    @field_validator("codec_streaming")
    @classmethod
    def _streaming_only(cls, value: bool) -> bool:
        # Ignoring `false` silently would repeat vllm-omni's dead keys; the switch that exists is async_chunk.
        if not value:
            raise ValueError(
                "false is not supported: whether codec frames stream between stages is set by the top-level "
                "async_chunk key (async_chunk: false ships each take to the codec in one piece)"
            )
        return value

    @field_validator("decode_cudagraph_capture_sizes")
    @classmethod
    def _sizes(cls, value: list[int] | None) -> list[int] | None:
        if value is None:
            return None
        if not value:
            raise ValueError("must list at least one size (omit the key to use the codec's own buckets)")
        if any(size <= 0 for size in value):
            raise ValueError(f"sizes must be positive frame counts, got {value}")
        if any(b <= a for a, b in zip(value, value[1:], strict=False)):
            raise ValueError(f"sizes must be sorted ascending without repeats, got {value}")
        return value

    @model_validator(mode="after")
    def _chunk_sizes(self) -> ConnectorExtraFields:
        if (
            self.initial_codec_chunk_frames is not None
            and self.initial_codec_chunk_frames > self.codec_chunk_frames
        ):
            raise ValueError(
                f"initial_codec_chunk_frames ({self.initial_codec_chunk_frames}) must not exceed "
                f"codec_chunk_frames ({self.codec_chunk_frames})"
            )
        return self

    @property
    def first_chunk_timeout_s(self) -> float:
        """Seconds a codec waits for a stream's first chunk: ``max_wait_first_chunk x sleep_s``."""
        return self.connector_get_max_wait_first_chunk * self.connector_get_sleep_s

    @property
    def stall_timeout_s(self) -> float:
        """Longest allowed gap between two chunks of one stream: ``max_wait x sleep_s``."""
        return self.connector_get_max_wait * self.connector_get_sleep_s

    def family_setting(self, key: str) -> Any:
        """A key one family owns (its descriptor's ``codec_dtype_key``); None when unset."""
        return getattr(self, key, None)


def _family_keys() -> dict[str, Any]:
    """The keys registered families own, each the compute dtype of that family's codec."""
    return {f.codec_dtype_key: (CodecDType | None, None) for f in families() if f.codec_dtype_key}


if TYPE_CHECKING:
    ConnectorExtra = ConnectorExtraFields
else:
    ConnectorExtra = create_model(
        "ConnectorExtra", __base__=ConnectorExtraFields, __module__=__name__, **_family_keys()
    )


class ConnectorConfig(StrictModel):
    """A named connector; stages refer to it from ``input_connectors`` / ``output_connectors``."""

    name: str
    extra: ConnectorExtra = Field(default_factory=ConnectorExtra)

    @field_validator("name", mode="before")
    @classmethod
    def _known_kind(cls, value: Any) -> Any:
        if isinstance(value, str) and value not in CONNECTOR_KINDS:
            raise ValueError(
                f"unknown connector kind {value!r}; known: {', '.join(CONNECTOR_KINDS)} "
                "(streams between hosts need no connector: they go inline over gRPC)"
            )
        return value

    @property
    def uses_shared_memory(self) -> bool:
        return self.name == "SharedMemoryConnector"


@dataclass(frozen=True)
class ChunkPlan:
    """The effective chunk settings of the talker -> codec stream, with every default resolved.

    A take's codec frames become audio in chunks: the first after ``initial_frames`` frames, each later one
    as long as the audio before it up to ``steady_frames`` (``ramp``) or every ``steady_frames``; the
    remainder is flushed when the take ends (``voxstage.chunking``). ``whole_take`` (``async_chunk: false``)
    means a single chunk at the end. The codec engine's own schedule object is built from these numbers.
    """

    initial_frames: int
    steady_frames: int
    left_context_frames: int
    whole_take: bool
    ramp: bool = True
    overlap_crop: bool = False  # decode each chunk afresh behind left_context_frames (codec_decode)

    def chunk_due(self, frames: int) -> bool:
        """True when a chunk boundary falls after a take's ``frames``-th frame (before the take ends)."""
        if self.whole_take or frames < 1:
            return False
        return next_boundary(frames - 1, self.initial_frames, self.steady_frames, self.ramp) == frames

    @classmethod
    def from_extra(cls, extra: ConnectorExtra, *, whole_take: bool) -> ChunkPlan:
        initial = extra.initial_codec_chunk_frames or extra.codec_chunk_frames
        return cls(
            initial_frames=initial,
            steady_frames=extra.codec_chunk_frames,
            left_context_frames=extra.codec_left_context_frames,
            whole_take=whole_take,
            ramp=extra.codec_chunk_ramp,
            overlap_crop=extra.codec_decode == "overlap_crop",
        )
