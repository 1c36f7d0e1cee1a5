"""A duplex session's settings and the one check both faces run on a ``session.update``.

Each face parses its wire form (JSON for ``/v1/realtime``, ``voxstage.v1.Session`` for ``Converse``) into a
``SettingsUpdate`` and names its fields its own way (``DuplexFields``); ``apply_update`` judges the values
against the served model and the deploy limits, so both faces refuse the same things with the same words.
An update is all or nothing: a refused one leaves the session as it was.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

import grpc
import numpy as np

from gateway.catalog import ModelInfo
from gateway.checks import check_number, check_sampling, resolve_model
from gateway.errors import GatewayError, invalid, not_found
from gateway.voice_aliases import resolve_alias
from gateway.voices.library import VoiceLibrary
from gateway.voices.store import EncodedVoice
from voxstage import limits
from voxstage.audio import AudioError, decode_audio
from voxstage.duplex import MAX_RECORDING_SECONDS
from voxstage.duplex_audio import DEFAULT_FORMAT, DuplexFormat
from voxstage.quote import quoted
from voxstage.v1 import speech_pb2

# Sampling fields a duplex session honours: the text stream's sampler (docs/protocol.md §11).
DUPLEX_SAMPLING = ("temperature", "top_k", "top_p")
# A voice recording: the codec encodes at most this much of it (voxstage.duplex).
MAX_VOICE_S = MAX_RECORDING_SECONDS
MAX_VOICE_BYTES = 8 * 1024 * 1024
_TURN_BASED = (
    "full duplex: audio goes to the model as it arrives and the model decides when to speak, in one "
    "long-running response per session"
)
# Client events of the Realtime GA vocabulary that a full-duplex session does not take, and why: both faces
# answer them (Converse by their Realtime names) with an error naming the reason.
UNSUPPORTED: dict[str, str] = {
    "input_audio_buffer.commit": f"{_TURN_BASED}; there is no buffer to commit",
    "input_audio_buffer.clear": f"{_TURN_BASED}; there is no uncommitted buffer to clear",
    "response.create": f"{_TURN_BASED}; responses are not requested",
    "response.cancel": f"{_TURN_BASED}; it cannot be cancelled (speak to interrupt the model)",
    "conversation.item.create": "the conversation is the audio stream; items cannot be added",
    "conversation.item.truncate": "the conversation is the audio stream; items cannot be truncated",
    "conversation.item.delete": "the conversation is the audio stream; items cannot be deleted",
    "conversation.item.retrieve": "the conversation is the audio stream; items cannot be retrieved",
    "output_audio_buffer.clear": "output_audio_buffer is a WebRTC/SIP event; this is a WebSocket session",
    "transcription_session.update": "transcription sessions are not served; this endpoint converses",
}


@dataclass(frozen=True)
class DuplexFields:
    """How one face spells each settable field, for error messages."""

    model: str
    instructions: str
    voice: str
    input_format: str
    output_format: str
    seed: str
    sampling: str  # prefix: "<sampling>temperature"
    voice_audio: str


WS_FIELDS = DuplexFields(
    model="session.model",
    instructions="session.instructions",
    voice="session.audio.output.voice",
    input_format="session.audio.input.format",
    output_format="session.audio.output.format",
    seed="session.voxstage.seed",
    sampling="session.voxstage.",
    voice_audio="session.voxstage.voice_audio",
)
GRPC_FIELDS = DuplexFields(
    model="session_update.session.model",
    instructions="session_update.session.instructions",
    voice="session_update.session.audio.output.voice",
    input_format="session_update.session.audio.input.format",
    output_format="session_update.session.audio.output.format",
    seed="session_update.session.seed",
    sampling="session_update.session.sampling.",
    voice_audio="session_update.session.voice_audio",
)


@dataclass(frozen=True)
class SessionSettings:
    model: str
    instructions: str = ""
    voice: str = ""  # empty: the talker's default
    input_format: DuplexFormat = DEFAULT_FORMAT
    output_format: DuplexFormat = DEFAULT_FORMAT
    seed: int | None = None
    sampling: speech_pb2.SamplingParams = field(default_factory=speech_pb2.SamplingParams)
    # A voice recording to speak with (mono float32 and its rate), decoded and checked at update time.
    voice_audio: tuple[np.ndarray, int] | None = None
    # ``voice`` names a voice of the voice library: its recording as encoded at upload.
    uploaded: EncodedVoice | None = None


@dataclass
class SettingsUpdate:
    """What one ``session.update`` asks for; None leaves a setting as it is."""

    model: str | None = None
    instructions: str | None = None
    voice: str | None = None
    input_format: DuplexFormat | None = None
    output_format: DuplexFormat | None = None
    seed: int | None = None
    sampling: speech_pb2.SamplingParams | None = None
    voice_audio: bytes | None = None  # an audio file's bytes


def session_mode_error(mode: str) -> GatewayError:
    return GatewayError(
        grpc.StatusCode.FAILED_PRECONDITION,
        f"full-duplex sessions need session_mode: duplex in the deploy file; this deployment runs "
        f"session_mode: {mode} (text-to-speech: Synthesize, StreamingSynthesize, POST /v1/audio/speech)",
        field="session_mode",
        reason="session_mode_not_duplex",
    )


def apply_update(
    current: SessionSettings,
    update: SettingsUpdate,
    served: ModelInfo | None,
    names: DuplexFields,
    *,
    max_text_chars: int,
    voice_aliases: Mapping[str, str] | None = None,
    voices: VoiceLibrary | None = None,
) -> SessionSettings:
    """The settings after ``update``, or a GatewayError naming the first field at fault."""
    changes: dict[str, object] = {}
    if update.model is not None:
        changes["model"] = resolve_model(update.model, served, names.model).name
    if update.instructions is not None:
        if len(update.instructions) > max_text_chars:
            raise invalid(
                names.instructions,
                f"{len(update.instructions)} characters exceeds the limit of {max_text_chars} "
                "(gateway.max_text_chars)",
                reason="text_too_long",
            )
        changes["instructions"] = update.instructions
    if update.voice is not None:
        uploaded = None
        if voices is not None and update.voice and served is not None:
            uploaded = voices.lookup(update.voice, served, names.voice)
        changes["uploaded"] = uploaded
        changes["voice"] = (
            update.voice.strip() if uploaded is not None
            else _check_voice(update.voice, served, names.voice, voice_aliases)
        )  # fmt: skip
    if update.input_format is not None:
        changes["input_format"] = update.input_format
    if update.output_format is not None:
        changes["output_format"] = update.output_format
    if update.seed is not None:
        check_number(limits.SEED, update.seed, names.seed)  # the talker's range and words
        changes["seed"] = update.seed
    if update.sampling is not None:
        changes["sampling"] = _merge_sampling(current.sampling, update.sampling, names.sampling)
    if update.voice_audio is not None:
        try:
            changes["voice_audio"] = decode_audio(
                update.voice_audio,
                field=names.voice_audio,
                max_bytes=MAX_VOICE_BYTES,
                max_seconds=MAX_VOICE_S,
            )
        except AudioError as exc:
            raise invalid(
                names.voice_audio, str(exc).removeprefix(f"{names.voice_audio}: "), reason="invalid_audio"
            ) from None
    voice = changes.get("voice", current.voice)
    recording = changes.get("voice_audio", current.voice_audio)
    if voice and recording is not None:
        raise invalid(names.voice_audio, "give a stored voice or a voice recording, not both")
    if served is not None and served.budget is not None:  # the session's prompt must fit the talker's window
        pcm, rate = recording if isinstance(recording, tuple) else (np.zeros(0), 1)
        seconds = pcm.size / rate
        uploaded = changes.get("uploaded", current.uploaded)
        if isinstance(uploaded, EncodedVoice):
            seconds = uploaded.meta.sample_seconds
        persona = changes.get("instructions", current.instructions)
        served.budget.check([(names.instructions, str(persona))], seconds, names.voice_audio)
    return replace(current, **changes)  # type: ignore[arg-type]


def _check_voice(
    voice: str, served: ModelInfo | None, field_name: str, aliases: Mapping[str, str] | None
) -> str:
    if not voice or served is None or not served.voices:
        return voice  # no list at the gateway: the talker judges the name (NOT_FOUND, relayed)
    found = served.find_voice(resolve_alias(voice, served, aliases, field_name))
    if found is None:
        known = ", ".join(v.name for v in served.voices)
        raise not_found(
            field_name,
            f"voice {quoted(voice)} is not a stored voice of model {served.name!r}; known: {known}",
            reason="voice_not_found",
        )
    return found.name


def _merge_sampling(
    current: speech_pb2.SamplingParams, update: speech_pb2.SamplingParams, prefix: str
) -> speech_pb2.SamplingParams:
    for name in ("repetition_penalty", "max_frames"):
        if update.HasField(name):
            raise invalid(
                f"{prefix}{name}",
                f"not used by duplex sessions; they take {', '.join(DUPLEX_SAMPLING)}",
                reason="unsupported_parameter",
            )
    check_sampling(update, prefix)
    merged = speech_pb2.SamplingParams()
    merged.CopyFrom(current)
    for name in DUPLEX_SAMPLING:
        if update.HasField(name):
            setattr(merged, name, getattr(update, name))
    return merged
