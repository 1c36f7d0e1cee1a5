"""What the async and sync duplex sessions share: the events a session yields and the messages it sends."""

from __future__ import annotations

from dataclasses import dataclass

from voxstage.duplex_audio import FORMATS, MAX_APPEND_BYTES, format_named
from voxstage.v1 import speech_pb2


@dataclass(frozen=True)
class SessionInfo:
    """The session's settings as the server holds them (``session.created`` / ``session.updated``)."""

    session_id: str
    model: str
    voice: str
    instructions: str
    input_format: str  # pcm, pcmu or pcma
    output_format: str
    sample_rate: int  # of the output audio


@dataclass(frozen=True)
class AgentAudio:
    """A piece of the agent's speech (80 ms) in the session's output format."""

    data: bytes
    response_id: str


@dataclass(frozen=True)
class AgentTranscript:
    """Text of the agent's speech, aligned with the audio around it."""

    text: str
    response_id: str


@dataclass(frozen=True)
class ServerNotice:
    """An in-band error: something the client sent was refused (or the session is closing, and why).
    The session goes on unless a ``ResponseDone`` follows."""

    code: str
    message: str
    param: str
    event_id: str


@dataclass(frozen=True)
class ResponseDone:
    """The session's one response ended: ``status`` is completed, incomplete (idle timeout, time limit)
    or failed; ``reason`` says why when it is not completed."""

    status: str
    reason: str
    audio_seconds: float


ConverseEvent = SessionInfo | AgentAudio | AgentTranscript | ServerNotice | ResponseDone
_STATUS = {
    speech_pb2.RESPONSE_STATUS_COMPLETED: "completed",
    speech_pb2.RESPONSE_STATUS_INCOMPLETE: "incomplete",
    speech_pb2.RESPONSE_STATUS_FAILED: "failed",
    speech_pb2.RESPONSE_STATUS_CANCELLED: "cancelled",
    speech_pb2.RESPONSE_STATUS_IN_PROGRESS: "in_progress",
}


def _format_message(name: str, arg: str) -> speech_pb2.RealtimeAudioFormat:
    fmt = format_named(name)
    if fmt is None:
        raise ValueError(f"{arg}: {name!r} is not one of {', '.join(f.name for f in FORMATS)}")
    return speech_pb2.RealtimeAudioFormat(encoding=fmt.encoding, sample_rate_hz=fmt.sample_rate)


def session_update(
    *,
    voice: str = "",
    instructions: str = "",
    model: str = "",
    input_format: str = "pcm",
    output_format: str = "pcm",
    seed: int | None = None,
    temperature: float | None = None,
    top_k: int | None = None,
    top_p: float | None = None,
    voice_audio: bytes | None = None,
) -> speech_pb2.ConverseRequest:
    session = speech_pb2.Session(model=model, instructions=instructions)
    if voice_audio is not None:
        session.voice_audio = voice_audio  # an audio file's bytes: the voice to speak with
    session.audio.input.format.CopyFrom(_format_message(input_format, "input_format"))
    session.audio.output.format.CopyFrom(_format_message(output_format, "output_format"))
    session.audio.output.voice = voice
    if seed is not None:
        session.seed = seed
    for name, value in (("temperature", temperature), ("top_k", top_k), ("top_p", top_p)):
        if value is not None:
            setattr(session.sampling, name, value)
    return speech_pb2.ConverseRequest(session_update=speech_pb2.SessionUpdate(session=session))


def appends(data: bytes) -> list[speech_pb2.ConverseRequest]:
    """``data`` as append events no larger than the server takes in one."""
    return [
        speech_pb2.ConverseRequest(
            input_audio_buffer_append=speech_pb2.InputAudioBufferAppend(audio=data[i : i + MAX_APPEND_BYTES])
        )
        for i in range(0, len(data), MAX_APPEND_BYTES)
    ]


def _format_name(fmt: speech_pb2.RealtimeAudioFormat) -> str:
    return next((f.name for f in FORMATS if f.encoding == fmt.encoding), str(fmt.encoding))


def event_from(reply: speech_pb2.ConverseResponse) -> ConverseEvent | None:
    """The SDK event for one server event (None for the ones it keeps to itself, e.g. response.created)."""
    kind = reply.WhichOneof("event")
    if kind == "response_output_audio_delta":
        d = reply.response_output_audio_delta
        return AgentAudio(d.delta, d.response_id)
    if kind == "response_output_audio_transcript_delta":
        t = reply.response_output_audio_transcript_delta
        return AgentTranscript(t.delta, t.response_id)
    if kind in ("session_created", "session_updated"):
        s = getattr(reply, kind).session
        return SessionInfo(
            session_id=s.id,
            model=s.model,
            voice=s.audio.output.voice,
            instructions=s.instructions,
            input_format=_format_name(s.audio.input.format),
            output_format=_format_name(s.audio.output.format),
            sample_rate=s.audio.output.format.sample_rate_hz,
        )
    if kind == "error":
        e = reply.error
        return ServerNotice(e.code, e.message, e.param, e.event_id)
    if kind == "response_done":
        r = reply.response_done.response
        return ResponseDone(
            _STATUS.get(r.status, "unknown"), r.status_reason, r.audio_duration.ToNanoseconds() / 1e9
        )
    return None
