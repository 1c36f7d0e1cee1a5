"""``StreamOpen`` (the wire) -> ``RequestParams`` (what the talker worker builds a request from).

Decodes the per-request sampling overrides, the seed and the voice-clone reference (x-vector and ICL codes)
and names the field of anything malformed. No model code: values the model must judge (voice names,
reference code range, prompt rules) are checked by the worker and the adapter.
"""

from __future__ import annotations

from voxstage import wire
from voxstage.internal.v1 import stage_pb2
from voxstage.stage_errors import StageFailure
from voxstage.talker.worker import RequestParams
from voxstage.transport.payload import read_payload
from voxstage.transport.shm_layout import InvalidShmReference


def request_params(op: stage_pb2.StreamOpen) -> RequestParams:
    s, sub = op.sampling, op.subtalker_sampling
    sampling = {f: getattr(s, f) for f in ("temperature", "top_p", "repetition_penalty") if s.HasField(f)}
    if s.HasField("top_k"):
        sampling["top_k"] = _top_k(s.top_k, "sampling.top_k")
    subtalker = {f: getattr(sub, f) for f in ("do_sample", "temperature", "top_p") if sub.HasField(f)}
    if sub.HasField("top_k"):
        subtalker["top_k"] = _top_k(sub.top_k, "subtalker_sampling.top_k")
    if s.HasField("max_frames") and s.max_frames < 1:
        raise StageFailure("INVALID_ARGUMENT", "sampling.max_frames: must be >= 1")
    ref = op.reference
    xvec = codes = None
    if ref.x_vector_dim:
        data = _inline(ref.x_vector, "reference.x_vector")
        xvec = wire.floats_from_bytes(data, ref.x_vector_dim, field="reference.x_vector")
    if ref.codes.frame_count:
        data = _inline(ref.codes.codes, "reference.codes")
        codes = wire.codes_from_bytes(
            data,
            ref.codes.frame_count,
            ref.codes.num_groups,
            field="reference.codes",
            codebook_size=1 << 15,  # the talker checks the real codebook size when it builds the prompt
        )
    return RequestParams(
        voice=op.voice or None,
        language=op.language or "auto",
        instructions=op.instructions or None,
        seed=op.seed if op.HasField("seed") else None,
        sampling=sampling,
        subtalker=subtalker,
        max_frames=s.max_frames if s.HasField("max_frames") else None,
        non_streaming=True if op.non_streaming_mode else None,
        speaker_embedding=xvec,
        ref_text=ref.text or None,
        ref_codes=codes,
    )


def _inline(payload: stage_pb2.Payload, field: str) -> bytes:
    # `open` arrives before shared memory is negotiated, so its payloads must be inline.
    try:
        return read_payload(payload, None)[0]
    except InvalidShmReference as exc:
        raise StageFailure("INVALID_ARGUMENT", f"{field}: {exc}") from exc


def _top_k(value: int, field: str) -> int:
    if value < -1:
        raise StageFailure("INVALID_ARGUMENT", f"{field}: must be -1 or 0 (off) or a positive integer")
    return max(value, 0)
