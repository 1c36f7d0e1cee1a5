"""Checks every face's requests share, text-to-speech and duplex alike: numbers against their ranges
(``voxstage.limits``, the same words as the talker's) and the model a request names against the served one.
"""

from __future__ import annotations

import grpc

from gateway.catalog import ModelInfo
from gateway.errors import GatewayError, invalid, not_found
from voxstage import limits
from voxstage.quote import quoted
from voxstage.v1 import speech_pb2

SAMPLED = (limits.TEMPERATURE, limits.TOP_K, limits.TOP_P, limits.REPETITION_PENALTY, limits.MAX_FRAMES)
SAMPLING = {limit.name: limit for limit in SAMPLED}  # keyed by the SamplingParams field


def check_number(limit: limits.IntRange | limits.FloatRange, value: object, name: str) -> None:
    """Refuse ``value`` outside ``limit`` (src/voxstage/limits.py), naming the field."""
    if (why := limit.problem(value)) is not None:
        raise invalid(name, why)


def check_sampling(
    params: speech_pb2.SamplingParams | speech_pb2.SubtalkerSamplingParams, prefix: str
) -> None:
    for key, limit in SAMPLING.items():
        if key in params.DESCRIPTOR.fields_by_name and params.HasField(key):
            check_number(limit, getattr(params, key), f"{prefix}{key}")


def check_max_frames(params: speech_pb2.SamplingParams, name: str, limit: int | None) -> None:
    """A request's ``max_frames`` may lower its take's frame cap, never lift it past the deploy maximum."""
    if limit is not None and params.HasField("max_frames") and params.max_frames > limit:
        raise invalid(
            name,
            f"must be at most {limit} (gateway.max_frames_limit, by default the talker's "
            f"default_sampling_params.max_tokens), got {params.max_frames}",
            reason="max_frames_too_large",
        )


def resolve_model(name: str, served: ModelInfo | None, field_name: str) -> ModelInfo:
    if served is None:
        raise GatewayError(
            grpc.StatusCode.UNAVAILABLE,
            "no talker has reported its model yet",
            field="talker",
            retry_after_s=1.0,
            reason="talker_unavailable",
        )
    if not name or name in served.aliases or name == served.name:
        return served
    served_here = f"model {quoted(name)} is not served here; served: {served.name}"
    raise not_found(field_name, served_here, reason="model_not_found")
