"""A text-to-speech stream's voice-clone reference, and ``EncodeVoice``: the same work, once per upload.

A stream's ``open`` carries either a reference clip (``reference.audio`` + transcript), which the codec turns
into an x-vector and, for in-context cloning, reference codes, or a voice-library voice already encoded by
``EncodeVoice`` (``voice_key`` set; codes, x-vector and transcript, no audio), which it uses as it is. Both
end as the same ``(codes, x-vector)``, so a request by an uploaded voice decodes and speaks exactly as the
same request with the clip inline.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from services.codec.duplex.open import recording_of
from voxstage import wire
from voxstage.internal.v1 import stage_pb2 as S
from voxstage.stage.errors import StageFailure
from voxstage.transport.payload import read_payload
from voxstage.transport.shm_layout import InvalidShmReference

Encoded = tuple[np.ndarray | None, np.ndarray | None]  # (ICL codes [frames, groups], x-vector [dim])


async def clone_reference(worker: Any, rt: Any, ref: S.VoiceReference) -> Encoded:
    """(ICL codes, x-vector) for a voice-clone request; both None without a reference."""
    if ref.voice_key:
        return _encoded(rt, ref)
    has_audio = ref.audio.WhichOneof("body") is not None
    if not has_audio:
        if ref.codes.frame_count or ref.x_vector_dim or ref.text:
            raise StageFailure("INVALID_ARGUMENT", "reference.audio: required with a reference")
        return None, None
    _check_clone(rt, ref.text)
    if not ref.audio_sample_rate_hz:
        raise StageFailure("INVALID_ARGUMENT", "reference.audio_sample_rate_hz: required")
    try:
        data, _ = read_payload(ref.audio, None)  # in `open`: shm is not negotiated yet
    except InvalidShmReference as exc:
        raise StageFailure("INVALID_ARGUMENT", f"reference.audio: {exc}") from exc
    pcm = wire.pcm_from_bytes(data, ref.audio_format, field="reference.audio")
    out = await worker.reference(pcm, ref.audio_sample_rate_hz, with_codes=bool(ref.text))
    return out.codes, out.x_vector


def _check_clone(rt: Any, text: str) -> None:
    if not rt.voice_clone:
        raise StageFailure(
            "INVALID_ARGUMENT", f"reference: {rt.model} cannot clone voices (needs a Base checkpoint)"
        )
    if rt.clone_from_codes and not text.strip():
        raise StageFailure(
            "INVALID_ARGUMENT",
            f"reference.text: required: {rt.model} clones a voice from the reference audio together with its "
            "transcript",
        )


def _encoded(rt: Any, ref: S.VoiceReference) -> Encoded:
    if ref.audio.WhichOneof("body") is not None:
        raise StageFailure(
            "INVALID_ARGUMENT", "reference.audio: an encoded voice (voice_key) carries no audio"
        )
    _check_clone(rt, ref.text)
    codes = xvec = None
    if ref.codes.frame_count:
        if ref.codes.num_groups != rt.num_groups:
            raise StageFailure(
                "INVALID_ARGUMENT",
                f"reference.codes.num_groups: {ref.codes.num_groups}, this codec has {rt.num_groups}",
            )
        data = _inline(ref.codes.codes, "reference.codes")
        codes = wire.codes_from_bytes(
            data, ref.codes.frame_count, rt.num_groups, field="reference.codes", codebook_size=1 << 15
        )
    if ref.x_vector_dim:
        xvec = wire.floats_from_bytes(
            _inline(ref.x_vector, "reference.x_vector"), ref.x_vector_dim, field="reference.x_vector"
        )
    if codes is None and xvec is None:
        raise StageFailure(
            "INVALID_ARGUMENT", "reference: an encoded voice (voice_key) needs codes or an x-vector"
        )
    return codes, xvec


def _inline(payload: S.Payload, field: str) -> bytes:
    try:
        return read_payload(payload, None)[0]
    except InvalidShmReference as exc:
        raise StageFailure("INVALID_ARGUMENT", f"{field}: {exc}") from exc


async def encode_voice(worker: Any, rt: Any, ref: S.VoiceReference, *, duplex: bool) -> S.VoiceReference:
    """``EncodeVoice``: what a stream's open would compute from ``ref``, returned instead of used."""
    if ref.voice_key or ref.codes.frame_count or ref.x_vector_dim:
        raise StageFailure("INVALID_ARGUMENT", "reference: send the sample's audio only (and its transcript)")
    if ref.audio.WhichOneof("body") is None:
        raise StageFailure("INVALID_ARGUMENT", "reference.audio: required")
    if not duplex:
        codes, xvec = await clone_reference(worker, rt, ref)
        return wire.voice_reference(ref.text, codes, xvec)
    pcm = recording_of(ref)
    assert pcm is not None
    return wire.voice_reference("", await worker.reference_codes(pcm, ref.audio_sample_rate_hz), None)
