"""``StreamOpen`` (the wire) -> ``RequestParams`` (what the talker worker builds a request from).

Decodes the per-request sampling overrides, the seed and the voice-clone reference (x-vector and ICL codes)
and names the field of anything malformed. No model code: values the model must judge (voice names,
reference code range, prompt rules) are checked by the worker and the adapter.
"""

from __future__ import annotations

from typing import Any

from services.talker.voice_cache import VoiceCache, VoicePrompt
from services.talker.worker import RequestParams
from voxstage import limits, wire
from voxstage.internal.v1 import stage_pb2
from voxstage.stage.errors import StageFailure
from voxstage.transport.payload import read_payload
from voxstage.transport.shm_layout import InvalidShmReference

# The same ranges the gateway checks (src/voxstage/limits.py), so a value either is refused at the gateway
# or passes here; a caller that bypasses the gateway gets the same words.
_FLOATS = {
    "temperature": limits.TEMPERATURE,
    "top_p": limits.TOP_P,
    "repetition_penalty": limits.REPETITION_PENALTY,
}


def request_params(op: stage_pb2.StreamOpen, voices: VoiceCache | None = None) -> RequestParams:
    s, sub = op.sampling, op.subtalker_sampling
    sampling = {f: _checked(s, f, "sampling") for f in _FLOATS if s.HasField(f)}
    if s.HasField("top_k"):
        sampling["top_k"] = _top_k(s.top_k, "sampling.top_k")
    subtalker: dict[str, Any] = {"do_sample": sub.do_sample} if sub.HasField("do_sample") else {}
    for f in ("temperature", "top_p"):
        if sub.HasField(f):
            subtalker[f] = _checked(sub, f, "subtalker_sampling")
    if sub.HasField("top_k"):
        subtalker["top_k"] = _top_k(sub.top_k, "subtalker_sampling.top_k")
    if s.HasField("max_frames"):
        _check(limits.MAX_FRAMES, s.max_frames, "sampling.max_frames")
    voice = _voice_prompt(op.reference, voices)
    return RequestParams(
        voice=op.voice or None,
        language=op.language or "auto",
        instructions=op.instructions or None,
        seed=op.seed if op.HasField("seed") else None,
        sampling=sampling,
        subtalker=subtalker,
        max_frames=s.max_frames if s.HasField("max_frames") else None,
        non_streaming=True if op.non_streaming_mode else None,
        speaker_embedding=voice.speaker_embedding,
        ref_text=voice.ref_text,
        ref_codes=voice.ref_codes,
        whole_clip=op.whole_clip,
    )


def _voice_prompt(ref: stage_pb2.VoiceReference, voices: VoiceCache | None) -> VoicePrompt:
    """The reference decoded; a voice-library voice (``voice_key``) from the cache once it has been."""
    if ref.voice_key and voices is not None and (hit := voices.get(ref.voice_key)) is not None:
        return hit
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
    prompt = VoicePrompt(xvec, codes, ref.text or None)
    if ref.voice_key and voices is not None:
        voices.put(ref.voice_key, prompt)
    return prompt


def _inline(payload: stage_pb2.Payload, field: str) -> bytes:
    # `open` arrives before shared memory is negotiated, so its payloads must be inline.
    try:
        return read_payload(payload, None)[0]
    except InvalidShmReference as exc:
        raise StageFailure("INVALID_ARGUMENT", f"{field}: {exc}") from exc


def _check(limit: limits.IntRange | limits.FloatRange, value: object, field: str) -> None:
    if (why := limit.problem(value)) is not None:
        raise StageFailure("INVALID_ARGUMENT", f"{field}: {why}")


def _checked(params: Any, name: str, prefix: str) -> Any:
    value = getattr(params, name)
    _check(_FLOATS[name], value, f"{prefix}.{name}")
    return value


def _top_k(value: int, field: str) -> int:
    if value != 0:  # 0 is the sampler's own "off", which stage callers may send as well as the public -1
        _check(limits.TOP_K, value, field)
    return max(value, 0)
