"""OpenAI Realtime GA events for ``/v1/realtime``: the client events voxstage takes (pydantic models, as
unmute models them) and the server events it sends (built to parse into ``openai.types.realtime``).

A full-duplex model listens and speaks at once and decides by itself when to talk, so of the Realtime
vocabulary only the audio-in/audio-out subset applies: ``session.update`` and ``input_audio_buffer.append``
in; ``session.created``/``updated``, one long-running response (``response.created``, audio and transcript
deltas, ``response.done``) and ``error`` out. Client events of the turn-based flow are answered with an
``error`` naming why (``gateway.duplex.settings.UNSUPPORTED``), and the session goes on. voxstage's own
settings ride under the vendor key ``session.voxstage``.
"""

from __future__ import annotations

import binascii
import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from gateway.duplex.session import Ended
from gateway.duplex.settings import SessionSettings, SettingsUpdate
from gateway.errors import GatewayError, invalid, openai_body
from voxstage import duplex_audio
from voxstage.base64_text import decode_base64_text
from voxstage.duplex_audio import DuplexAudioError, DuplexFormat, check_format, format_of_type
from voxstage.quote import quoted
from voxstage.v1 import speech_pb2


class _Strict(BaseModel):
    # strict: "0.5" is not a number here, as it is not on HTTP (gateway.http.speech.SpeechRequest).
    model_config = ConfigDict(extra="forbid", strict=True)


class AudioFormatSpec(_Strict):
    type: str
    rate: int | None = None


class VoiceId(_Strict):
    id: str


class AudioInput(_Strict):
    format: AudioFormatSpec | None = None
    # Turn-taking, input transcription and noise reduction are the model's or not offered: null only.
    turn_detection: None = None
    transcription: None = None
    noise_reduction: None = None


class AudioOutput(_Strict):
    format: AudioFormatSpec | None = None
    voice: str | VoiceId | None = None
    speed: Literal[1, 1.0] | None = None


class AudioConfig(_Strict):
    input: AudioInput | None = None
    output: AudioOutput | None = None


class VoxstageSettings(_Strict):
    """The vendor extension ``session.voxstage``: reproducible sampling of the agent's text stream."""

    seed: int | None = Field(default=None, ge=0, lt=2**63)
    temperature: float | None = None
    top_k: int | None = Field(default=None, ge=-(2**31), lt=2**31)
    top_p: float | None = None
    # base64 of an audio file (WAV/FLAC/OGG): the voice to speak with, instead of a stored voice.
    voice_audio: str | None = None


class SessionConfig(_Strict):
    type: Literal["realtime"] | None = None
    model: str | None = None
    instructions: str | None = None
    output_modalities: list[Literal["audio"]] | None = None
    audio: AudioConfig | None = None
    voxstage: VoxstageSettings | None = None
    # Accepted when they ask for nothing: a client that sends the GA defaults must not be refused.
    tools: list[None] | None = None
    tool_choice: Literal["none", "auto"] | None = None
    max_output_tokens: Literal["inf"] | None = None
    tracing: None = None


class SessionUpdateEvent(_Strict):
    type: Literal["session.update"]
    event_id: str | None = None
    session: SessionConfig


class InputAudioBufferAppendEvent(_Strict):
    type: Literal["input_audio_buffer.append"]
    event_id: str | None = None
    audio: str


def _format(spec: AudioFormatSpec | None, param: str) -> DuplexFormat | None:
    if spec is None:
        return None
    fmt = format_of_type(spec.type)
    if fmt is None:
        raise invalid(
            f"{param}.type",
            f"{quoted(spec.type)} is not supported; use {duplex_audio.allowed_types()}",
            reason="unsupported_format",
        )
    try:
        return check_format(fmt, spec.rate)
    except DuplexAudioError as exc:
        raise invalid(f"{param}.rate", str(exc), reason="unsupported_format") from None


def settings_update(config: SessionConfig) -> SettingsUpdate:
    update = SettingsUpdate(model=config.model, instructions=config.instructions)
    audio = config.audio or AudioConfig()
    if audio.input is not None:
        update.input_format = _format(audio.input.format, "session.audio.input.format")
    if audio.output is not None:
        out = audio.output
        update.output_format = _format(out.format, "session.audio.output.format")
        update.voice = out.voice.id if isinstance(out.voice, VoiceId) else out.voice
    ext = config.voxstage
    if ext is not None:
        update.seed = ext.seed
        if ext.voice_audio is not None:
            try:
                update.voice_audio = decode_base64_text(ext.voice_audio)
            except ValueError:
                raise invalid(
                    "session.voxstage.voice_audio", "not valid base64", reason="invalid_audio"
                ) from None
        sampling = speech_pb2.SamplingParams()
        for name in ("temperature", "top_k", "top_p"):
            value = getattr(ext, name)
            if value is not None:
                setattr(sampling, name, value)
        update.sampling = sampling if sampling.ListFields() else None
    return update


# -- server events --------------------------------------------------------------------------------------


def format_json(fmt: DuplexFormat) -> dict[str, Any]:
    return (
        {"type": fmt.realtime_type, "rate": fmt.sample_rate}
        if fmt.name == "pcm"
        else {"type": fmt.realtime_type}
    )


def session_json(session_id: str, s: SessionSettings) -> dict[str, Any]:
    sampling = {name: getattr(s.sampling, name) for name in ("temperature", "top_k", "top_p")}
    return {
        "type": "realtime",
        "object": "realtime.session",
        "id": session_id,
        "model": s.model,
        "output_modalities": ["audio"],
        "instructions": s.instructions,
        "audio": {
            "input": {
                "format": format_json(s.input_format),
                "turn_detection": None,
                "transcription": None,
                "noise_reduction": None,
            },
            "output": {"format": format_json(s.output_format), "voice": s.voice or None, "speed": 1.0},
        },
        "tools": [],
        "tool_choice": "none",
        "max_output_tokens": "inf",
        "tracing": None,
        "voxstage": {
            "seed": s.seed,
            **{k: (v if s.sampling.HasField(k) else None) for k, v in sampling.items()},
        },
    }


def response_json(
    response_id: str, s: SessionSettings, status: str, end: Ended | None = None
) -> dict[str, Any]:
    details: dict[str, Any] | None = None
    if end is not None and end.status != "completed":
        details = {"type": end.status, "reason": end.error.reason if end.error is not None else None}
        if end.error is not None and end.status == "failed":
            details["error"] = {"type": "server_error", "code": end.error.reason, "message": end.error.text}
    return {
        "object": "realtime.response",
        "id": response_id,
        "status": status,
        "status_details": details,
        "output": [],
        "output_modalities": ["audio"],
        "audio": {"output": {"format": format_json(s.output_format), "voice": s.voice or None}},
        "conversation_id": None,
        "max_output_tokens": "inf",
        "metadata": None,
        "usage": None,
    }


def audio_delta(kind: str, ids: tuple[str, str], delta: str) -> dict[str, Any]:
    response_id, item_id = ids
    return {
        "type": kind,
        "response_id": response_id,
        "item_id": item_id,
        "output_index": 0,
        "content_index": 0,
        "delta": delta,
    }


class DeltaText:
    """The JSON text of one response's ``kind`` deltas, equal to ``json.dumps`` of ``audio_delta(...)`` with
    its ``event_id`` added, built around the payload instead of through the encoder.

    Every session sends one audio delta per 80 ms frame; ``json.dumps`` of that dict scanned its 5 KB of
    base64 for characters to escape, three times what encoding the audio cost (docs/benchmarks.md, "The
    gateway's WebSocket face per session"). Base64 has none to escape, so an audio delta is the fixed head,
    the payload and the ``event_id`` tail; a transcript delta, any text, goes through the encoder alone."""

    def __init__(self, kind: str, ids: tuple[str, str]) -> None:
        head = json.dumps(audio_delta(kind, ids, ""))
        # The dict's last key is the empty "delta": the head ends at its opening quote.
        assert head.endswith('"delta": ""}'), head
        self.head = head[:-2]

    def base64(self, data: bytes, event_id: str) -> str:
        """``data`` as base64: the alphabet (A-Z a-z 0-9 + / =) is JSON as it stands."""
        return self._text(binascii.b2a_base64(data, newline=False).decode("ascii"), event_id)

    def text(self, delta: str, event_id: str) -> str:
        return self._text(json.dumps(delta)[1:-1], event_id)

    def _text(self, body: str, event_id: str) -> str:
        return f'{self.head}{body}", "event_id": {json.dumps(event_id)}}}'


def error_json(err: GatewayError, client_event_id: str | None) -> dict[str, Any]:
    body = openai_body(err)["error"]
    body["event_id"] = client_event_id
    return {"type": "error", "error": body}
