"""The ``open`` of a duplex Codec.Stream (docs/protocol.md §11): what the codec checks before it takes a slot,
and the ``open`` it forwards to the talker. Protobuf and numpy only (no torch, no grpc).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from services.codec.duplex.types import REFERENCE_RATES
from voxstage import wire
from voxstage.duplex import MAX_RECORDING_SECONDS
from voxstage.internal.v1 import stage_pb2 as S
from voxstage.stage.errors import StageFailure
from voxstage.transport.payload import read_payload
from voxstage.transport.shm_layout import InvalidShmReference

AGENT_CREDIT_FRAMES = 25  # agent frames the talker may send ahead of the PCM the gateway took (§11)
TTS_ONLY = ("language", "non_streaming_mode")  # (and chunk_schedule, a message field)


@dataclass(frozen=True)
class DuplexOpen:
    pcm_format: int
    sample_rate: int  # of the agent audio
    window: int  # samples of agent audio the gateway granted up front: the most that may wait for credit
    recording: np.ndarray | None  # the voice recording, float32 mono at ``recording_rate``
    recording_rate: int
    # A voice-library voice: its recording's codes as encoded at upload (EncodeVoice), used as they are.
    codes: np.ndarray | None = None


def check_open(
    op: S.StreamOpen, *, native_rate: int, samples_per_frame: int, num_groups: int = 8
) -> DuplexOpen:
    """Every field a duplex ``open`` may get wrong, each refused naming it (INVALID_ARGUMENT)."""
    for name in TTS_ONLY:
        if getattr(op, name):
            raise StageFailure("INVALID_ARGUMENT", f"{name}: not used by duplex sessions")
    if op.HasField("chunk_schedule"):
        raise StageFailure("INVALID_ARGUMENT", "chunk_schedule: duplex audio moves one frame per tick")
    if not op.talker_address:
        raise StageFailure("INVALID_ARGUMENT", "talker_address: required (host:port of the talker)")
    fmt = op.pcm_format or S.PCM_FORMAT_S16LE
    if fmt not in (S.PCM_FORMAT_S16LE, S.PCM_FORMAT_F32LE):
        raise StageFailure("INVALID_ARGUMENT", "pcm_format: must be PCM_FORMAT_S16LE or PCM_FORMAT_F32LE")
    rate = op.sample_rate_hz or native_rate
    if not 8000 <= rate <= 48000:
        raise StageFailure("INVALID_ARGUMENT", f"sample_rate_hz: {rate} is outside 8000..48000")
    # Two frames: the streaming resampler hands out a frame's audio in uneven pieces (up to ~1.5x).
    need = 2 * math.ceil(samples_per_frame * rate / native_rate)
    credit = op.initial_credit
    if credit.unit != S.CREDIT_UNIT_SAMPLES or credit.amount < need:
        raise StageFailure(
            "INVALID_ARGUMENT",
            f"initial_credit: need at least {need} SAMPLES (2 frames at {rate} Hz), got {credit.amount} in "
            f"unit {S.CreditUnit.Name(credit.unit)}",
        )
    if op.reference.voice_key:
        return DuplexOpen(fmt, rate, credit.amount, None, 0, encoded_codes(op.reference, num_groups))
    recording = recording_of(op.reference)
    return DuplexOpen(fmt, rate, credit.amount, recording, op.reference.audio_sample_rate_hz)


def encoded_codes(ref: S.VoiceReference, num_groups: int) -> np.ndarray:
    """The codes of an already encoded voice recording (a voice-library voice, ``voice_key`` set)."""
    if ref.audio.WhichOneof("body") is not None or ref.text or ref.x_vector_dim:
        raise StageFailure(
            "INVALID_ARGUMENT", "reference: an encoded voice (voice_key) carries codes only, no audio or text"
        )
    if not ref.codes.frame_count:
        raise StageFailure("INVALID_ARGUMENT", "reference.codes: required with reference.voice_key")
    try:
        data, _ = read_payload(ref.codes.codes, None)
    except InvalidShmReference as exc:
        raise StageFailure("INVALID_ARGUMENT", f"reference.codes: {exc}") from exc
    if ref.codes.num_groups != num_groups:
        raise StageFailure(
            "INVALID_ARGUMENT",
            f"reference.codes.num_groups: {ref.codes.num_groups}, this codec has {num_groups}",
        )
    # The talker checks the code range against its codebook when it builds the prompt.
    return wire.codes_from_bytes(
        data, ref.codes.frame_count, num_groups, field="reference.codes", codebook_size=1 << 15
    )


def recording_of(ref: S.VoiceReference) -> np.ndarray | None:
    if ref.text:
        raise StageFailure("INVALID_ARGUMENT", "reference.text: duplex voice recordings take no transcript")
    if ref.x_vector_dim or ref.x_vector.WhichOneof("body"):
        raise StageFailure("INVALID_ARGUMENT", "reference.x_vector: not used by duplex sessions")
    if ref.codes.frame_count or ref.codes.codes.WhichOneof("body"):
        raise StageFailure(
            "INVALID_ARGUMENT", "reference.codes: the codec computes them from reference.audio"
        )
    if ref.audio.WhichOneof("body") is None:
        return None
    lo, hi = REFERENCE_RATES
    if not lo <= ref.audio_sample_rate_hz <= hi:
        raise StageFailure(
            "INVALID_ARGUMENT",
            f"reference.audio_sample_rate_hz: {ref.audio_sample_rate_hz} is outside {lo}..{hi}",
        )
    try:
        data, _ = read_payload(ref.audio, None)  # in `open`: shm is not negotiated yet
    except InvalidShmReference as exc:
        raise StageFailure("INVALID_ARGUMENT", f"reference.audio: {exc}") from exc
    pcm = wire.pcm_from_bytes(data, ref.audio_format, field="reference.audio")
    seconds = pcm.size / ref.audio_sample_rate_hz
    if seconds > MAX_RECORDING_SECONDS:
        raise StageFailure(
            "INVALID_ARGUMENT",
            f"reference.audio: {seconds:.1f} s exceeds the limit of {MAX_RECORDING_SECONDS:g} s",
        )
    return pcm


def talker_open(op: S.StreamOpen, codes: np.ndarray | None) -> S.StreamOpen:
    """The talker's ``open``: the session's model, voice, persona, seed and samplers, the recording's codes
    (``[frames, K]``, inline) and the agent-frame window; ``transport`` is the relay's to fill."""
    out = S.StreamOpen(
        request_id=op.request_id,
        mode=S.STREAM_MODE_DUPLEX,
        model=op.model,
        voice=op.voice,
        instructions=op.instructions,
        initial_credit=S.Credit(unit=S.CREDIT_UNIT_FRAMES, amount=AGENT_CREDIT_FRAMES),
    )
    if op.HasField("seed"):
        out.seed = op.seed
    if op.HasField("sampling"):
        out.sampling.CopyFrom(op.sampling)
    if op.HasField("subtalker_sampling"):
        out.subtalker_sampling.CopyFrom(op.subtalker_sampling)
    if codes is not None:
        out.reference.codes.CopyFrom(wire.voice_reference("", codes, None).codes)
        out.reference.voice_key = op.reference.voice_key
    return out
