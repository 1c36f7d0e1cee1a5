"""Validation shared by the gRPC and HTTP faces: one neutral request in, one checked ``SynthesisJob`` out.

Each face fills a ``RawRequest`` and says how its fields are spelled (``FieldNames``), so the same check
produces ``config.sampling.temperature: ...`` on gRPC and ``temperature: ...`` on HTTP. Everything that can
be judged at the gateway is judged here, before admission: a malformed request never takes a slot or
touches a stage. What only the model knows (e.g. a voice when the catalog has no voice list) is judged by
the talker and relayed with its code.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import grpc
import numpy as np

from gateway.catalog import AUTO_LANGUAGE, ModelInfo
from gateway.checks import SAMPLING, check_max_frames, check_number, check_sampling, resolve_model
from gateway.errors import GatewayError, invalid, not_found
from gateway.voice_aliases import resolve_alias
from voxstage import formats, limits
from voxstage.audio import AudioError, AudioFormat, audio_from_base64, decode_audio
from voxstage.quote import quoted
from voxstage.v1 import speech_pb2

if TYPE_CHECKING:
    from gateway.voices.library import VoiceLibrary
    from gateway.voices.store import EncodedVoice


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
    pcm: np.ndarray  # mono float32; empty for a voice of the library (``encoded`` stands for it)
    sample_rate: int
    text: str
    # A voice-library voice: the codec's encoding of its sample, sent instead of the audio.
    encoded: EncodedVoice | None = None


@dataclass(frozen=True)
class ReferenceInput:
    """Reference audio as it arrived. Nothing of it is parsed until the rest of the request has passed and
    the model is known to take a reference (issue 15: an hour of FLAC was decoded for a model that could
    not use it); then ``decode_reference`` decodes it off the event loop."""

    payload: bytes | str  # str: base64 or a data: URL (HTTP), decoded in the worker thread too
    text: str
    field: str  # the name errors use
    kind: str = "file"  # "file" (self-describing container), "s16" or "f32" (headerless, at sample_rate)
    sample_rate: int = 0  # declared; 0 = from the container
    rate_field: str = ""


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
    reference: ReferenceInput | None = None
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
    # Text tokens a take of this request may still hold after its reference clip, transcript and
    # instructions (the talker's limits, text_budget.py); None: the talker reported none.
    text_tokens_left: int | None = None
    voice_label: str = ""  # how logs and StreamStarted name the voice when it is not ``voice`` (an upload)


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


def check_subtalker(params: speech_pb2.SubtalkerSamplingParams, prefix: str) -> None:
    check_sampling(params, prefix)
    if params.do_sample and params.HasField("temperature") and params.temperature == 0:
        raise invalid(f"{prefix}do_sample", "true requires temperature > 0")


def sampling_from(values: Mapping[str, object], prefix: str) -> speech_pb2.SamplingParams:
    """Sampling overrides from plain numbers (HTTP), each checked before it touches the protobuf: a setattr
    of 2**40 into an int32 field raises, which answered 500 instead of naming the field (issue 15)."""
    params = speech_pb2.SamplingParams()
    for key, value in values.items():
        if value is not None:
            check_number(SAMPLING[key], value, f"{prefix}{key}")
            setattr(params, key, value)
    return params


def _resolve_voice(
    raw: RawRequest, model: ModelInfo, names: FieldNames, aliases: Mapping[str, str] | None
) -> str:
    if not raw.voice:
        return model.default_voice
    if model.voices is None:
        return raw.voice  # unknown list: the talker judges it
    voice = resolve_alias(raw.voice, model, aliases, names.voice)
    if not model.voices:
        raise invalid(
            names.voice,
            f"model {model.name!r} ({model.variant}) has no preset voices; "
            f"leave it empty{' and send ' + names.ref_audio if model.needs_reference else ''}",
            reason="voice_not_supported",
        )
    found = model.find_voice(voice)
    if found is None:
        known = ", ".join(v.name for v in model.voices)
        raise not_found(
            names.voice,
            f"voice {quoted(raw.voice)} does not exist for model {model.name!r}; known: {known}",
            reason="voice_not_found",
        )
    return found.name


def _check_output(raw: RawRequest, model: ModelInfo, names: FieldNames) -> int:
    if (why := limits.SAMPLE_RATE.problem(raw.sample_rate)) is not None:
        raise invalid(names.sample_rate, why, reason="bad_sample_rate")
    # A native rate the encoder lacks (Opus has no 44.1 kHz) is resampled to its fallback; an asked-for one
    # it lacks is refused, naming the field.
    rate = formats.output_rate(raw.fmt.spec, raw.sample_rate, model.sample_rate_hz)
    if (why := formats.rate_problem(raw.fmt.spec, rate)) is not None:
        raise invalid(names.sample_rate, why, reason="bad_sample_rate")
    return rate


async def build_job(
    raw: RawRequest,
    served: ModelInfo | None,
    names: FieldNames,
    *,
    max_text_chars: int,
    voice_aliases: Mapping[str, str] | None = None,
    text: str = "",
    max_frames_limit: int | None = None,
    voices: VoiceLibrary | None = None,
) -> SynthesisJob:
    """Every check, the cheap ones first; the reference clip (if any) is decoded last, in a worker thread,
    and only when nothing else is wrong with the request. ``voice_aliases`` is ``gateway.voice_aliases``
    (None: the family's built-in table). ``text`` is a whole request's text (streamed text is judged per
    segment as it arrives, against ``text_tokens_left``). ``voices`` is the voice library: a ``voice``
    naming one of its voices (id or name) becomes that voice's encoded reference."""
    uploaded = None
    if voices is not None and raw.voice and served is not None:
        model = resolve_model(raw.model, served, names.model)
        uploaded = voices.lookup(raw.voice, model, names.voice)
        known = model.voices is None or voices.builtin(raw.voice, model) is not None
        if uploaded is None and voices.enabled and not known:
            raise not_found(
                names.voice,
                f"voice {quoted(raw.voice)} is neither a built-in voice of model {model.name!r} nor a voice "
                "of the voice library",
                reason="voice_not_found",
            )
        if uploaded is not None:
            if raw.reference is not None:
                raise invalid(
                    names.ref_audio,
                    f"give an uploaded voice ({names.voice}) or reference audio, not both",
                    reason="voice_and_reference",
                )
            raw = replace(raw, voice="")
    job = _check_job(
        raw, served, names, max_text_chars=max_text_chars, voice_aliases=voice_aliases,
        uploaded=uploaded is not None,
    )  # fmt: skip
    check_max_frames(raw.sampling, f"{names.sampling}max_frames", max_frames_limit)
    budget = job.model.budget
    fixed = [(names.instructions, raw.instructions)]  # in every take's prompt
    if raw.reference is not None:
        fixed.append((names.ref_text, raw.reference.text))
    if uploaded is not None:
        meta = uploaded.meta
        fixed.append((names.voice, meta.ref_text))
        job.voice_label = meta.name
        job.reference = Reference(np.zeros(0, np.float32), meta.sample_rate, meta.ref_text, uploaded)
    if budget is not None:
        budget.check([(names.text, text), *fixed])  # before the clip is decoded: texts that cannot fit
    if raw.reference is not None:
        job.reference = await decode_reference(raw.reference)
    if budget is not None:
        ref = job.reference
        seconds = 0.0 if ref is None else ref.pcm.size / ref.sample_rate
        if uploaded is not None:
            seconds = uploaded.meta.sample_seconds
        budget.check([(names.text, text), *fixed], seconds, names.ref_audio)
        job.text_tokens_left = budget.check(fixed, seconds, names.ref_audio)
    return job


def _check_job(
    raw: RawRequest,
    served: ModelInfo | None,
    names: FieldNames,
    *,
    max_text_chars: int,
    voice_aliases: Mapping[str, str] | None,
    uploaded: bool = False,
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
    voice = _resolve_voice(raw, model, names, voice_aliases)
    language = ""
    if raw.language:
        resolved = model.resolve_language(raw.language)
        if resolved is None:
            known = ", ".join([AUTO_LANGUAGE, *(model.languages or ())])
            raise invalid(
                names.language,
                f"{quoted(raw.language)} is not supported by model {model.name!r}; use {known}",
                reason="unsupported_language",
            )
        language = resolved
    if raw.instructions:
        if not model.takes_instructions:
            kind = "a voice-clone (base)" if model.needs_reference else f"an {model.family}"
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
    if raw.reference is not None and model.needs_reference_text and not raw.reference.text.strip():
        raise invalid(
            names.ref_text,
            f"required with {names.ref_audio}: model {model.name!r} clones a voice from the reference audio "
            "together with its transcript",
            reason="reference_text_required",
        )
    if raw.reference is None and model.needs_reference and not uploaded:
        raise invalid(
            names.ref_audio,
            f"model {model.name!r} is a voice-clone (base) model and needs reference audio",
            reason="reference_required",
        )
    if raw.reference is not None:
        _check_reference(raw.reference)
        if len(raw.reference.text) > max_text_chars:
            raise invalid(
                names.ref_text,
                f"{len(raw.reference.text)} characters exceeds the limit of {max_text_chars} "
                "(gateway.max_text_chars)",
                reason="text_too_long",
            )
    if raw.seed is not None:
        check_number(limits.SEED, raw.seed, names.seed)  # the talker's own range and words: [0, 2**63)
    check_sampling(raw.sampling, names.sampling)
    check_subtalker(raw.subtalker, names.subtalker)
    for key, value in (
        ("initial_chunk_frames", raw.initial_chunk_frames),
        ("steady_chunk_frames", raw.steady_chunk_frames),
    ):
        check_number(limits.CHUNK_FRAMES, value, f"{names.chunk}{key}")
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
        reference=None,  # decoded by build_job once everything else has passed
        initial_chunk_frames=raw.initial_chunk_frames,
        steady_chunk_frames=raw.steady_chunk_frames,
        non_streaming=raw.non_streaming,
        fmt=raw.fmt,
        sample_rate=_check_output(raw, model, names),
    )


def reference_from_grpc(ref: speech_pb2.ReferenceAudio) -> ReferenceInput:
    """``config.reference_audio``, not yet decoded; its encoding is judged with the other fields."""
    kinds = {
        speech_pb2.AUDIO_ENCODING_PCM_S16LE: "s16",
        speech_pb2.AUDIO_ENCODING_PCM_F32LE: "f32",
        speech_pb2.AUDIO_ENCODING_WAV: "file",
    }
    return ReferenceInput(
        payload=ref.data,
        text=ref.text,
        field=GRPC_FIELDS.ref_audio,
        kind=kinds.get(ref.encoding) or formats.encoding_name(ref.encoding),
        sample_rate=ref.sample_rate_hz,
        rate_field="config.reference_audio.sample_rate_hz",
    )


def _check_reference(ref: ReferenceInput) -> None:
    # What can be judged without touching the audio, with the other cheap checks.
    if ref.kind not in ("file", "s16", "f32"):
        raise invalid(
            "config.reference_audio.encoding",
            f"{ref.kind} is not accepted; use PCM_S16LE, PCM_F32LE or WAV",
            reason="bad_reference_audio",
        )
    if ref.kind != "file" and ref.sample_rate == 0:
        raise invalid(ref.rate_field, "required for headerless PCM")
    if ref.sample_rate:
        check_number(limits.REFERENCE_SAMPLE_RATE, ref.sample_rate, ref.rate_field)


async def decode_reference(ref: ReferenceInput) -> Reference:
    """Decode the clip in a worker thread (a minute of 48 kHz FLAC is tens of ms of CPU the event loop,
    /health included, must not wait for) and raise any refusal here, outside the decoding frames."""
    outcome = await asyncio.to_thread(_decode_reference, ref)
    if isinstance(outcome, GatewayError):
        raise outcome  # created outside any except block: it carries no decoded audio in a chained context
    return outcome


def _decode_reference(ref: ReferenceInput) -> Reference | GatewayError:
    # Worker thread. Returns refusals instead of raising them, so no traceback of this frame (and of the
    # decoder's, where the samples lived) outlives the call: issue 15's arrays stayed until a GC cycle.
    message = ""
    try:
        data = ref.payload if isinstance(ref.payload, bytes) else audio_from_base64(ref.payload)
        pcm, rate = decode_audio(
            data,
            field=ref.field,
            max_bytes=limits.REFERENCE_BYTES.end - 1,
            max_seconds=limits.REFERENCE_SECONDS.high,
            raw_sample_rate=None if ref.kind == "file" else ref.sample_rate,
            raw_format="s16" if ref.kind == "file" else ref.kind,
        )
    except AudioError as exc:
        message = str(exc).split(": ", 1)[-1]
    if message:
        return invalid(ref.field, message, reason="bad_reference_audio")
    if ref.kind == "file" and ref.sample_rate and ref.sample_rate != rate:
        del pcm
        return invalid(ref.rate_field, f"{ref.sample_rate} Hz does not match the WAV header's {rate} Hz")
    return Reference(pcm=pcm, sample_rate=rate, text=ref.text)
