"""Validation shared by the gRPC and HTTP faces: one neutral request in, one checked ``SynthesisJob`` out.

Each face fills a ``RawRequest`` and says how its fields are spelled (``FieldNames``), so the same check
produces ``config.sampling.temperature: ...`` on gRPC and ``temperature: ...`` on HTTP. Everything that can
be judged at the gateway is judged here, before admission: a malformed request never takes a slot or
touches a stage. What only the model knows (e.g. a voice when the catalog has no voice list) is judged by
the talker and relayed with its code.
"""

from __future__ import annotations

import math
import uuid
from dataclasses import dataclass, field

import grpc
import numpy as np

from voxstage.audio import OPUS_RATES, AudioError, AudioFormat, decode_audio, validate_sample_rate
from voxstage.gateway.catalog import AUTO_LANGUAGE, ModelInfo
from voxstage.gateway.errors import GatewayError, invalid, not_found
from voxstage.v1 import speech_pb2

MAX_CHUNK_FRAMES = 1000
MAX_REFERENCE_BYTES = 10 * 1024 * 1024
MAX_REFERENCE_SECONDS = 60.0


@dataclass(frozen=True)
class FieldNames:
    """How one API spells each logical field, for error messages."""

    text: str
    model: str
    voice: str
    language: str
    instructions: str
    format: str
    sample_rate: str
    seed: str
    sampling: str  # prefix: "<sampling>temperature"
    subtalker: str
    ref_audio: str
    ref_text: str
    chunk: str


GRPC_FIELDS = FieldNames(
    text="text",
    model="config.model",
    voice="config.voice",
    language="config.language",
    instructions="config.instructions",
    format="config.encoding",
    sample_rate="config.sample_rate_hz",
    seed="config.seed",
    sampling="config.sampling.",
    subtalker="config.subtalker_sampling.",
    ref_audio="config.reference_audio.data",
    ref_text="config.reference_audio.text",
    chunk="config.chunk_schedule.",
)
HTTP_FIELDS = FieldNames(
    text="input",
    model="model",
    voice="voice",
    language="language",
    instructions="instructions",
    format="response_format",
    sample_rate="sample_rate",
    seed="seed",
    sampling="",
    subtalker="subtalker_",
    ref_audio="ref_audio",
    ref_text="ref_text",
    chunk="",
)


@dataclass(frozen=True)
class Reference:
    pcm: np.ndarray  # mono float32
    sample_rate: int
    text: str


@dataclass
class RawRequest:
    """What a face parsed from the wire, before any semantic check."""

    fmt: AudioFormat
    model: str = ""
    voice: str = ""
    language: str = ""
    instructions: str = ""
    sample_rate: int = 0
    seed: int | None = None
    sampling: speech_pb2.SamplingParams = field(default_factory=speech_pb2.SamplingParams)
    subtalker: speech_pb2.SubtalkerSamplingParams = field(default_factory=speech_pb2.SubtalkerSamplingParams)
    reference: Reference | None = None
    initial_chunk_frames: int = 0
    steady_chunk_frames: int = 0
    non_streaming: bool = False


@dataclass
class SynthesisJob:
    """A checked request: everything the codec stream's ``open`` needs, plus the output side."""

    request_id: str
    model: ModelInfo
    voice: str
    language: str
    instructions: str
    seed: int | None
    sampling: speech_pb2.SamplingParams
    subtalker: speech_pb2.SubtalkerSamplingParams
    reference: Reference | None
    initial_chunk_frames: int
    steady_chunk_frames: int
    non_streaming: bool
    fmt: AudioFormat
    sample_rate: int  # output rate (native when the request asked for none)


def check_text(text: str, name: str, limit: int, *, already: int = 0, delta: bool = False) -> None:
    """Reject empty text and text over ``gateway.max_text_chars``. A streamed ``delta`` may be blank (the
    space between two words); ``already`` counts the deltas before it."""
    if not delta and not text.strip():
        raise invalid(name, "must not be empty", reason="empty_text")
    if already + len(text) > limit:
        raise invalid(
            name,
            f"{already + len(text)} characters exceeds the limit of {limit} (gateway.max_text_chars)",
            reason="text_too_long",
        )


def _finite(value: float, name: str) -> float:
    if not math.isfinite(value):
        raise invalid(name, f"must be a finite number, got {value}")
    return value


def check_sampling(params: speech_pb2.SamplingParams, prefix: str) -> None:
    if params.HasField("temperature") and _finite(params.temperature, f"{prefix}temperature") < 0:
        raise invalid(f"{prefix}temperature", f"must be >= 0 (0 = greedy), got {params.temperature:g}")
    if params.HasField("top_k") and params.top_k != -1 and params.top_k < 1:
        raise invalid(f"{prefix}top_k", f"must be -1 (off) or >= 1, got {params.top_k}")
    if params.HasField("top_p") and not 0 < _finite(params.top_p, f"{prefix}top_p") <= 1:
        raise invalid(f"{prefix}top_p", f"must be in (0, 1], got {params.top_p:g}")
    if params.HasField("repetition_penalty"):
        if _finite(params.repetition_penalty, f"{prefix}repetition_penalty") <= 0:
            raise invalid(f"{prefix}repetition_penalty", f"must be > 0, got {params.repetition_penalty:g}")
    if params.HasField("max_frames") and params.max_frames < 1:
        raise invalid(f"{prefix}max_frames", f"must be >= 1, got {params.max_frames}")


def check_subtalker(params: speech_pb2.SubtalkerSamplingParams, prefix: str) -> None:
    if params.HasField("temperature") and _finite(params.temperature, f"{prefix}temperature") < 0:
        raise invalid(f"{prefix}temperature", f"must be >= 0, got {params.temperature:g}")
    if params.HasField("top_k") and params.top_k != -1 and params.top_k < 1:
        raise invalid(f"{prefix}top_k", f"must be -1 (off) or >= 1, got {params.top_k}")
    if params.HasField("top_p") and not 0 < _finite(params.top_p, f"{prefix}top_p") <= 1:
        raise invalid(f"{prefix}top_p", f"must be in (0, 1], got {params.top_p:g}")
    if params.do_sample and params.HasField("temperature") and params.temperature == 0:
        raise invalid(f"{prefix}do_sample", "true requires temperature > 0")


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
    raise not_found(
        field_name, f"model {name!r} is not served here; served: {served.name}", reason="model_not_found"
    )


def _resolve_voice(raw: RawRequest, model: ModelInfo, names: FieldNames) -> str:
    if not raw.voice:
        return model.default_voice
    if model.voices is None:
        return raw.voice  # unknown list: the talker judges it
    if not model.voices:
        raise invalid(
            names.voice,
            f"model {model.name!r} ({model.variant}) has no preset voices; "
            f"leave it empty{' and send ' + names.ref_audio if model.variant == 'base' else ''}",
            reason="voice_not_supported",
        )
    found = model.find_voice(raw.voice)
    if found is None:
        known = ", ".join(v.name for v in model.voices)
        raise not_found(
            names.voice,
            f"voice {raw.voice!r} does not exist for model {model.name!r}; known: {known}",
            reason="voice_not_found",
        )
    return found.name


def _check_output(raw: RawRequest, model: ModelInfo, names: FieldNames) -> int:
    if raw.sample_rate == 0:
        rate = model.sample_rate_hz
    else:
        try:
            rate = validate_sample_rate(raw.sample_rate, field=names.sample_rate)
        except AudioError as exc:
            raise invalid(names.sample_rate, str(exc).split(": ", 1)[1], reason="bad_sample_rate") from None
    if raw.fmt is AudioFormat.OPUS and raw.sample_rate == 0 and rate not in OPUS_RATES:
        rate = 48_000  # Opus has no 44.1 kHz mode: a native rate it lacks is resampled to its full band
    if raw.fmt is AudioFormat.OPUS and rate not in OPUS_RATES:
        raise invalid(
            names.sample_rate,
            f"opus supports {', '.join(map(str, OPUS_RATES))} Hz, not {rate}",
            reason="bad_sample_rate",
        )
    return rate


def build_job(
    raw: RawRequest, served: ModelInfo | None, names: FieldNames, *, max_text_chars: int
) -> SynthesisJob:
    model = resolve_model(raw.model, served, names.model)
    if model.duplex_only:
        raise GatewayError(
            grpc.StatusCode.FAILED_PRECONDITION,
            f"model {model.name!r} ({model.family}) is a full-duplex speech-to-speech model and does not "
            "synthesize text; open a session with Converse (gRPC) or the WebSocket /v1/realtime",
            field=names.model,
            reason="tts_not_supported",
        )
    voice = _resolve_voice(raw, model, names)
    language = ""
    if raw.language:
        resolved = model.resolve_language(raw.language)
        if resolved is None:
            known = ", ".join([AUTO_LANGUAGE, *(model.languages or ())])
            raise invalid(
                names.language,
                f"{raw.language!r} is not supported by model {model.name!r}; use {known}",
                reason="unsupported_language",
            )
        language = resolved
    if raw.instructions:
        if not model.takes_instructions:
            kind = "a voice-clone (base)" if model.variant == "base" else f"an {model.family}"
            raise invalid(
                names.instructions,
                f"model {model.name!r} is {kind} model and takes no instructions",
                reason="instructions_not_supported",
            )
        if len(raw.instructions) > max_text_chars:
            raise invalid(
                names.instructions,
                f"{len(raw.instructions)} characters exceeds the limit of "
                f"{max_text_chars} (gateway.max_text_chars)",
                reason="text_too_long",
            )
    if raw.reference is not None and not model.takes_reference:
        raise invalid(
            names.ref_audio,
            f"model {model.name!r} ({model.variant}) does not support voice cloning; use a base model",
            reason="voice_clone_not_supported",
        )
    if raw.reference is not None and model.variant == "plain" and not raw.reference.text.strip():
        raise invalid(
            names.ref_text,
            f"required with {names.ref_audio}: model {model.name!r} clones a voice from the reference audio "
            "together with its transcript",
            reason="reference_text_required",
        )
    if raw.reference is None and model.needs_reference:
        raise invalid(
            names.ref_audio,
            f"model {model.name!r} is a voice-clone (base) model and needs reference audio",
            reason="reference_required",
        )
    if raw.seed is not None and not 0 <= raw.seed < 2**64:
        raise invalid(names.seed, f"must be an integer in [0, 2^64), got {raw.seed}")
    check_sampling(raw.sampling, names.sampling)
    check_subtalker(raw.subtalker, names.subtalker)
    for key, value in (
        ("initial_chunk_frames", raw.initial_chunk_frames),
        ("steady_chunk_frames", raw.steady_chunk_frames),
    ):
        if not 0 <= value <= MAX_CHUNK_FRAMES:
            raise invalid(f"{names.chunk}{key}", f"must be in [0, {MAX_CHUNK_FRAMES}] (0 = deploy value)")
    if 0 < raw.steady_chunk_frames < raw.initial_chunk_frames:
        raise invalid(f"{names.chunk}initial_chunk_frames", "must not exceed steady_chunk_frames")
    return SynthesisJob(
        request_id=uuid.uuid4().hex,
        model=model,
        voice=voice,
        language=language,
        instructions=raw.instructions,
        seed=raw.seed,
        sampling=raw.sampling,
        subtalker=raw.subtalker,
        reference=raw.reference,
        initial_chunk_frames=raw.initial_chunk_frames,
        steady_chunk_frames=raw.steady_chunk_frames,
        non_streaming=raw.non_streaming,
        fmt=raw.fmt,
        sample_rate=_check_output(raw, model, names),
    )


def _decode(data: bytes, field_name: str, raw_sample_rate: int | None) -> tuple[np.ndarray, int]:
    try:
        return decode_audio(
            data,
            field=field_name,
            max_bytes=MAX_REFERENCE_BYTES,
            max_seconds=MAX_REFERENCE_SECONDS,
            raw_sample_rate=raw_sample_rate,
        )
    except AudioError as exc:
        raise invalid(field_name, str(exc).split(": ", 1)[-1], reason="bad_reference_audio") from None


def _decode_f32(data: bytes, name: str, rate: int) -> tuple[np.ndarray, int]:
    # decode_audio only knows s16 for headerless input, so float PCM gets the same limits here.
    def bad(why: str) -> GatewayError:
        return invalid(name, why, reason="bad_reference_audio")

    if not data:
        raise bad("empty audio")
    if len(data) > MAX_REFERENCE_BYTES:
        raise bad(f"{len(data)} bytes exceeds the limit of {MAX_REFERENCE_BYTES} bytes")
    if len(data) % 4:
        raise bad("f32le audio must be a multiple of 4 bytes")
    try:
        validate_sample_rate(rate, field="config.reference_audio.sample_rate_hz")
    except AudioError as exc:
        raise invalid("config.reference_audio.sample_rate_hz", str(exc).split(": ", 1)[-1]) from None
    pcm = np.frombuffer(data, dtype="<f4").astype(np.float32)
    if pcm.size / rate > MAX_REFERENCE_SECONDS:
        raise bad(f"{pcm.size / rate:.1f} s exceeds the limit of {MAX_REFERENCE_SECONDS:.0f} s")
    if not np.isfinite(pcm).all():
        raise bad("audio contains NaN or infinite samples")
    return pcm, rate


def reference_from_file(data: bytes, text: str, *, field_name: str) -> Reference:
    """A reference clip in a self-describing container (WAV, FLAC, OGG, MP3)."""
    pcm, rate = _decode(data, field_name, None)
    return Reference(pcm=pcm, sample_rate=rate, text=text)


def reference_from_grpc(ref: speech_pb2.ReferenceAudio) -> Reference:
    name = GRPC_FIELDS.ref_audio
    enc = ref.encoding
    if enc == speech_pb2.AUDIO_ENCODING_PCM_S16LE:
        if ref.sample_rate_hz == 0:
            raise invalid("config.reference_audio.sample_rate_hz", "required for headerless PCM")
        pcm, rate = _decode(ref.data, name, ref.sample_rate_hz)
    elif enc == speech_pb2.AUDIO_ENCODING_PCM_F32LE:
        if ref.sample_rate_hz == 0:
            raise invalid("config.reference_audio.sample_rate_hz", "required for headerless PCM")
        pcm, rate = _decode_f32(ref.data, name, ref.sample_rate_hz)
    elif enc == speech_pb2.AUDIO_ENCODING_WAV:
        pcm, rate = _decode(ref.data, name, None)
        if ref.sample_rate_hz and ref.sample_rate_hz != rate:
            raise invalid(
                "config.reference_audio.sample_rate_hz",
                f"{ref.sample_rate_hz} Hz does not match the WAV header's {rate} Hz",
            )
    else:
        enc_name = speech_pb2.AudioEncoding.Name(enc)
        raise invalid(
            "config.reference_audio.encoding",
            f"{enc_name} is not accepted; use PCM_S16LE, PCM_F32LE or WAV",
            reason="bad_reference_audio",
        )
    return Reference(pcm=pcm, sample_rate=rate, text=ref.text)
