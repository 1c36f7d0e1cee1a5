"""Small builders and parsers for ``voxstage.internal.v1`` messages shared by the stage servicers.

Imports protobuf messages only (no grpc, no torch), so both servicers and tests can use it.
"""

from __future__ import annotations

import numpy as np
from google.protobuf.duration_pb2 import Duration

from voxstage.internal.v1 import stage_pb2
from voxstage.stage.errors import CODES, StageFailure

CODE_DTYPE = np.dtype("<i2")  # CodecFrames.codes: int16 little-endian [frames, groups]


def duration(seconds: float | None) -> Duration | None:
    if seconds is None:
        return None
    d = Duration()
    d.FromNanoseconds(int(seconds * 1e9))
    return d


def timings(queued: float | None, first_output: float | None, total: float | None) -> stage_pb2.StageTimings:
    return stage_pb2.StageTimings(
        queued=duration(queued), first_output=duration(first_output), total=duration(total)
    )


def end_of_stream(
    reason: int,
    *,
    frames: int = 0,
    samples: int = 0,
    error: stage_pb2.StreamError | None = None,
    stage_timings: stage_pb2.StageTimings | None = None,
) -> stage_pb2.EndOfStream:
    return stage_pb2.EndOfStream(
        reason=reason, frame_count=frames, sample_count=samples, error=error, timings=stage_timings
    )


def stream_error(code: str | int, message: str, origin: str) -> stage_pb2.StreamError:
    number = CODES[code] if isinstance(code, str) else code
    return stage_pb2.StreamError(code=number, message=message, origin=origin)


def codes_to_bytes(codes: np.ndarray) -> bytes:
    """Engine codes (any integer dtype) -> the wire's int16 LE ``[frames, groups]`` bytes."""
    return np.ascontiguousarray(codes, dtype=CODE_DTYPE).tobytes()


def codes_from_bytes(data: bytes, frames: int, groups: int, *, field: str, codebook_size: int) -> np.ndarray:
    """The wire's int16 LE bytes -> int64 ``[frames, groups]``; any mismatch raises INVALID_ARGUMENT."""
    if groups < 1 or len(data) != frames * groups * CODE_DTYPE.itemsize:
        raise StageFailure(
            "INVALID_ARGUMENT",
            f"{field}: {len(data)} bytes do not hold {frames} frames x {groups} groups of int16",
        )
    codes = np.frombuffer(data, dtype=CODE_DTYPE).reshape(frames, groups).astype(np.int64)
    if codes.size and (codes.min() < 0 or codes.max() >= codebook_size):
        raise StageFailure(
            "INVALID_ARGUMENT",
            f"{field}: codes must lie in [0, {codebook_size}), got [{codes.min()}, {codes.max()}]",
        )
    return codes


def floats_from_bytes(data: bytes, count: int, *, field: str) -> np.ndarray:
    if len(data) != 4 * count:
        raise StageFailure("INVALID_ARGUMENT", f"{field}: {len(data)} bytes do not hold {count} float32")
    out = np.frombuffer(data, dtype="<f4").astype(np.float32)
    if not np.isfinite(out).all():
        raise StageFailure("INVALID_ARGUMENT", f"{field}: contains NaN or infinite values")
    return out


def pcm_from_bytes(data: bytes, fmt: int, *, field: str) -> np.ndarray:
    """Mono PCM in ``PcmFormat`` -> float32 in [-1, 1]."""
    if fmt == stage_pb2.PCM_FORMAT_S16LE:
        if len(data) % 2:
            raise StageFailure("INVALID_ARGUMENT", f"{field}: s16le audio needs an even byte count")
        return np.frombuffer(data, dtype="<i2").astype(np.float32) / 32768.0
    if fmt == stage_pb2.PCM_FORMAT_F32LE:
        if len(data) % 4:
            raise StageFailure("INVALID_ARGUMENT", f"{field}: f32le audio needs a multiple of 4 bytes")
        return np.frombuffer(data, dtype="<f4").astype(np.float32)
    raise StageFailure(
        "INVALID_ARGUMENT", f"{field}: audio_format must be PCM_FORMAT_S16LE or PCM_FORMAT_F32LE"
    )


def pcm_to_bytes(pcm: np.ndarray, fmt: int) -> bytes:
    if fmt == stage_pb2.PCM_FORMAT_F32LE:
        return np.ascontiguousarray(pcm, dtype="<f4").tobytes()
    return (np.clip(pcm, -1.0, 1.0) * 32767.0).round().astype("<i2").tobytes()


def resolve_schedule(
    requested: stage_pb2.ChunkSchedule, initial: int, steady: int, left: int
) -> stage_pb2.ChunkSchedule:
    """A request's chunk schedule with 0 fields taken from the deploy values; bad values name the field."""
    ini = requested.initial_chunk_frames or initial
    std = requested.steady_chunk_frames or steady
    if not 1 <= ini <= std:
        raise StageFailure(
            "INVALID_ARGUMENT",
            f"chunk_schedule: need 1 <= initial_chunk_frames ({ini}) <= steady_chunk_frames ({std})",
        )
    if std > 4096:
        raise StageFailure("INVALID_ARGUMENT", f"chunk_schedule.steady_chunk_frames: {std} exceeds 4096")
    return stage_pb2.ChunkSchedule(
        initial_chunk_frames=ini,
        steady_chunk_frames=std,
        left_context_frames=requested.left_context_frames or left,
    )


def voice_reference(
    text: str, codes: np.ndarray | None, x_vector: np.ndarray | None
) -> stage_pb2.VoiceReference:
    """What the codec forwards to the talker for a voice clone: transcript, ICL codes, x-vector (inline)."""
    out = stage_pb2.VoiceReference(text=text)
    if x_vector is not None:
        out.x_vector.inline = np.ascontiguousarray(x_vector, dtype="<f4").tobytes()
        out.x_vector_dim = x_vector.shape[0]
    if codes is not None:
        out.codes.CopyFrom(
            stage_pb2.CodecFrames(
                first_frame=0,
                frame_count=codes.shape[0],
                num_groups=codes.shape[1],
                codes=stage_pb2.Payload(inline=codes_to_bytes(codes)),
            )
        )
    return out
