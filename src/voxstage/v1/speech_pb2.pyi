import datetime

from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class AudioEncoding(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    AUDIO_ENCODING_UNSPECIFIED: _ClassVar[AudioEncoding]
    AUDIO_ENCODING_PCM_S16LE: _ClassVar[AudioEncoding]
    AUDIO_ENCODING_PCM_F32LE: _ClassVar[AudioEncoding]
    AUDIO_ENCODING_WAV: _ClassVar[AudioEncoding]
    AUDIO_ENCODING_MULAW: _ClassVar[AudioEncoding]
    AUDIO_ENCODING_ALAW: _ClassVar[AudioEncoding]
    AUDIO_ENCODING_OGG_OPUS: _ClassVar[AudioEncoding]
    AUDIO_ENCODING_MP3: _ClassVar[AudioEncoding]
    AUDIO_ENCODING_FLAC: _ClassVar[AudioEncoding]

class FinishReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FINISH_REASON_UNSPECIFIED: _ClassVar[FinishReason]
    FINISH_REASON_END_OF_SPEECH: _ClassVar[FinishReason]
    FINISH_REASON_MAX_FRAMES: _ClassVar[FinishReason]
    FINISH_REASON_FRAME_CAP: _ClassVar[FinishReason]

class TurnDetectionType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TURN_DETECTION_TYPE_UNSPECIFIED: _ClassVar[TurnDetectionType]
    TURN_DETECTION_TYPE_NONE: _ClassVar[TurnDetectionType]
    TURN_DETECTION_TYPE_SERVER_VAD: _ClassVar[TurnDetectionType]
    TURN_DETECTION_TYPE_SEMANTIC_VAD: _ClassVar[TurnDetectionType]

class ResponseStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    RESPONSE_STATUS_UNSPECIFIED: _ClassVar[ResponseStatus]
    RESPONSE_STATUS_IN_PROGRESS: _ClassVar[ResponseStatus]
    RESPONSE_STATUS_COMPLETED: _ClassVar[ResponseStatus]
    RESPONSE_STATUS_CANCELLED: _ClassVar[ResponseStatus]
    RESPONSE_STATUS_INCOMPLETE: _ClassVar[ResponseStatus]
    RESPONSE_STATUS_FAILED: _ClassVar[ResponseStatus]
AUDIO_ENCODING_UNSPECIFIED: AudioEncoding
AUDIO_ENCODING_PCM_S16LE: AudioEncoding
AUDIO_ENCODING_PCM_F32LE: AudioEncoding
AUDIO_ENCODING_WAV: AudioEncoding
AUDIO_ENCODING_MULAW: AudioEncoding
AUDIO_ENCODING_ALAW: AudioEncoding
AUDIO_ENCODING_OGG_OPUS: AudioEncoding
AUDIO_ENCODING_MP3: AudioEncoding
AUDIO_ENCODING_FLAC: AudioEncoding
FINISH_REASON_UNSPECIFIED: FinishReason
FINISH_REASON_END_OF_SPEECH: FinishReason
FINISH_REASON_MAX_FRAMES: FinishReason
FINISH_REASON_FRAME_CAP: FinishReason
TURN_DETECTION_TYPE_UNSPECIFIED: TurnDetectionType
TURN_DETECTION_TYPE_NONE: TurnDetectionType
TURN_DETECTION_TYPE_SERVER_VAD: TurnDetectionType
TURN_DETECTION_TYPE_SEMANTIC_VAD: TurnDetectionType
RESPONSE_STATUS_UNSPECIFIED: ResponseStatus
RESPONSE_STATUS_IN_PROGRESS: ResponseStatus
RESPONSE_STATUS_COMPLETED: ResponseStatus
RESPONSE_STATUS_CANCELLED: ResponseStatus
RESPONSE_STATUS_INCOMPLETE: ResponseStatus
RESPONSE_STATUS_FAILED: ResponseStatus

class SamplingParams(_message.Message):
    __slots__ = ("temperature", "top_k", "top_p", "repetition_penalty", "max_frames")
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    REPETITION_PENALTY_FIELD_NUMBER: _ClassVar[int]
    MAX_FRAMES_FIELD_NUMBER: _ClassVar[int]
    temperature: float
    top_k: int
    top_p: float
    repetition_penalty: float
    max_frames: int
    def __init__(self, temperature: _Optional[float] = ..., top_k: _Optional[int] = ..., top_p: _Optional[float] = ..., repetition_penalty: _Optional[float] = ..., max_frames: _Optional[int] = ...) -> None: ...

class SubtalkerSamplingParams(_message.Message):
    __slots__ = ("do_sample", "temperature", "top_k", "top_p")
    DO_SAMPLE_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    do_sample: bool
    temperature: float
    top_k: int
    top_p: float
    def __init__(self, do_sample: _Optional[bool] = ..., temperature: _Optional[float] = ..., top_k: _Optional[int] = ..., top_p: _Optional[float] = ...) -> None: ...

class ReferenceAudio(_message.Message):
    __slots__ = ("data", "encoding", "sample_rate_hz", "text")
    DATA_FIELD_NUMBER: _ClassVar[int]
    ENCODING_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_RATE_HZ_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    encoding: AudioEncoding
    sample_rate_hz: int
    text: str
    def __init__(self, data: _Optional[bytes] = ..., encoding: _Optional[_Union[AudioEncoding, str]] = ..., sample_rate_hz: _Optional[int] = ..., text: _Optional[str] = ...) -> None: ...

class ChunkSchedule(_message.Message):
    __slots__ = ("initial_chunk_frames", "steady_chunk_frames")
    INITIAL_CHUNK_FRAMES_FIELD_NUMBER: _ClassVar[int]
    STEADY_CHUNK_FRAMES_FIELD_NUMBER: _ClassVar[int]
    initial_chunk_frames: int
    steady_chunk_frames: int
    def __init__(self, initial_chunk_frames: _Optional[int] = ..., steady_chunk_frames: _Optional[int] = ...) -> None: ...

class SynthesisConfig(_message.Message):
    __slots__ = ("model", "voice", "language", "instructions", "encoding", "sample_rate_hz", "seed", "sampling", "subtalker_sampling", "reference_audio", "chunk_schedule", "non_streaming_mode")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VOICE_FIELD_NUMBER: _ClassVar[int]
    LANGUAGE_FIELD_NUMBER: _ClassVar[int]
    INSTRUCTIONS_FIELD_NUMBER: _ClassVar[int]
    ENCODING_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_RATE_HZ_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    SUBTALKER_SAMPLING_FIELD_NUMBER: _ClassVar[int]
    REFERENCE_AUDIO_FIELD_NUMBER: _ClassVar[int]
    CHUNK_SCHEDULE_FIELD_NUMBER: _ClassVar[int]
    NON_STREAMING_MODE_FIELD_NUMBER: _ClassVar[int]
    model: str
    voice: str
    language: str
    instructions: str
    encoding: AudioEncoding
    sample_rate_hz: int
    seed: int
    sampling: SamplingParams
    subtalker_sampling: SubtalkerSamplingParams
    reference_audio: ReferenceAudio
    chunk_schedule: ChunkSchedule
    non_streaming_mode: bool
    def __init__(self, model: _Optional[str] = ..., voice: _Optional[str] = ..., language: _Optional[str] = ..., instructions: _Optional[str] = ..., encoding: _Optional[_Union[AudioEncoding, str]] = ..., sample_rate_hz: _Optional[int] = ..., seed: _Optional[int] = ..., sampling: _Optional[_Union[SamplingParams, _Mapping]] = ..., subtalker_sampling: _Optional[_Union[SubtalkerSamplingParams, _Mapping]] = ..., reference_audio: _Optional[_Union[ReferenceAudio, _Mapping]] = ..., chunk_schedule: _Optional[_Union[ChunkSchedule, _Mapping]] = ..., non_streaming_mode: _Optional[bool] = ...) -> None: ...

class SynthesizeRequest(_message.Message):
    __slots__ = ("config", "text")
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    config: SynthesisConfig
    text: str
    def __init__(self, config: _Optional[_Union[SynthesisConfig, _Mapping]] = ..., text: _Optional[str] = ...) -> None: ...

class SynthesizeResponse(_message.Message):
    __slots__ = ("audio", "encoding", "sample_rate_hz", "channels", "summary")
    AUDIO_FIELD_NUMBER: _ClassVar[int]
    ENCODING_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_RATE_HZ_FIELD_NUMBER: _ClassVar[int]
    CHANNELS_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_FIELD_NUMBER: _ClassVar[int]
    audio: bytes
    encoding: AudioEncoding
    sample_rate_hz: int
    channels: int
    summary: SynthesisSummary
    def __init__(self, audio: _Optional[bytes] = ..., encoding: _Optional[_Union[AudioEncoding, str]] = ..., sample_rate_hz: _Optional[int] = ..., channels: _Optional[int] = ..., summary: _Optional[_Union[SynthesisSummary, _Mapping]] = ...) -> None: ...

class Flush(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class StreamingSynthesizeRequest(_message.Message):
    __slots__ = ("config", "text", "flush")
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    FLUSH_FIELD_NUMBER: _ClassVar[int]
    config: SynthesisConfig
    text: str
    flush: Flush
    def __init__(self, config: _Optional[_Union[SynthesisConfig, _Mapping]] = ..., text: _Optional[str] = ..., flush: _Optional[_Union[Flush, _Mapping]] = ...) -> None: ...

class StreamingSynthesizeResponse(_message.Message):
    __slots__ = ("started", "audio", "segment_done", "summary")
    STARTED_FIELD_NUMBER: _ClassVar[int]
    AUDIO_FIELD_NUMBER: _ClassVar[int]
    SEGMENT_DONE_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_FIELD_NUMBER: _ClassVar[int]
    started: StreamStarted
    audio: AudioChunk
    segment_done: SegmentDone
    summary: SynthesisSummary
    def __init__(self, started: _Optional[_Union[StreamStarted, _Mapping]] = ..., audio: _Optional[_Union[AudioChunk, _Mapping]] = ..., segment_done: _Optional[_Union[SegmentDone, _Mapping]] = ..., summary: _Optional[_Union[SynthesisSummary, _Mapping]] = ...) -> None: ...

class StreamStarted(_message.Message):
    __slots__ = ("request_id", "encoding", "sample_rate_hz", "channels", "model", "voice")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    ENCODING_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_RATE_HZ_FIELD_NUMBER: _ClassVar[int]
    CHANNELS_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VOICE_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    encoding: AudioEncoding
    sample_rate_hz: int
    channels: int
    model: str
    voice: str
    def __init__(self, request_id: _Optional[str] = ..., encoding: _Optional[_Union[AudioEncoding, str]] = ..., sample_rate_hz: _Optional[int] = ..., channels: _Optional[int] = ..., model: _Optional[str] = ..., voice: _Optional[str] = ...) -> None: ...

class AudioChunk(_message.Message):
    __slots__ = ("data", "sample_offset", "segment_index")
    DATA_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_OFFSET_FIELD_NUMBER: _ClassVar[int]
    SEGMENT_INDEX_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    sample_offset: int
    segment_index: int
    def __init__(self, data: _Optional[bytes] = ..., sample_offset: _Optional[int] = ..., segment_index: _Optional[int] = ...) -> None: ...

class SegmentDone(_message.Message):
    __slots__ = ("segment_index", "sample_count", "time_to_first_audio", "duration", "finish_reason")
    SEGMENT_INDEX_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_COUNT_FIELD_NUMBER: _ClassVar[int]
    TIME_TO_FIRST_AUDIO_FIELD_NUMBER: _ClassVar[int]
    DURATION_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    segment_index: int
    sample_count: int
    time_to_first_audio: _duration_pb2.Duration
    duration: _duration_pb2.Duration
    finish_reason: FinishReason
    def __init__(self, segment_index: _Optional[int] = ..., sample_count: _Optional[int] = ..., time_to_first_audio: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., duration: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., finish_reason: _Optional[_Union[FinishReason, str]] = ...) -> None: ...

class SynthesisSummary(_message.Message):
    __slots__ = ("request_id", "finish_reason", "segment_count", "sample_count", "frame_count", "audio_duration", "time_to_first_audio", "total_duration")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    SEGMENT_COUNT_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_COUNT_FIELD_NUMBER: _ClassVar[int]
    FRAME_COUNT_FIELD_NUMBER: _ClassVar[int]
    AUDIO_DURATION_FIELD_NUMBER: _ClassVar[int]
    TIME_TO_FIRST_AUDIO_FIELD_NUMBER: _ClassVar[int]
    TOTAL_DURATION_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    finish_reason: FinishReason
    segment_count: int
    sample_count: int
    frame_count: int
    audio_duration: _duration_pb2.Duration
    time_to_first_audio: _duration_pb2.Duration
    total_duration: _duration_pb2.Duration
    def __init__(self, request_id: _Optional[str] = ..., finish_reason: _Optional[_Union[FinishReason, str]] = ..., segment_count: _Optional[int] = ..., sample_count: _Optional[int] = ..., frame_count: _Optional[int] = ..., audio_duration: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., time_to_first_audio: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., total_duration: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class ListVoicesRequest(_message.Message):
    __slots__ = ("model", "language")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    LANGUAGE_FIELD_NUMBER: _ClassVar[int]
    model: str
    language: str
    def __init__(self, model: _Optional[str] = ..., language: _Optional[str] = ...) -> None: ...

class ListVoicesResponse(_message.Message):
    __slots__ = ("voices",)
    VOICES_FIELD_NUMBER: _ClassVar[int]
    voices: _containers.RepeatedCompositeFieldContainer[Voice]
    def __init__(self, voices: _Optional[_Iterable[_Union[Voice, _Mapping]]] = ...) -> None: ...

class Voice(_message.Message):
    __slots__ = ("name", "model", "languages", "description", "native_sample_rate_hz", "uploaded", "id", "family", "ref_text", "sample_duration", "created", "consent")
    NAME_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    LANGUAGES_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    NATIVE_SAMPLE_RATE_HZ_FIELD_NUMBER: _ClassVar[int]
    UPLOADED_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    FAMILY_FIELD_NUMBER: _ClassVar[int]
    REF_TEXT_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_DURATION_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    CONSENT_FIELD_NUMBER: _ClassVar[int]
    name: str
    model: str
    languages: _containers.RepeatedScalarFieldContainer[str]
    description: str
    native_sample_rate_hz: int
    uploaded: bool
    id: str
    family: str
    ref_text: str
    sample_duration: _duration_pb2.Duration
    created: _timestamp_pb2.Timestamp
    consent: bool
    def __init__(self, name: _Optional[str] = ..., model: _Optional[str] = ..., languages: _Optional[_Iterable[str]] = ..., description: _Optional[str] = ..., native_sample_rate_hz: _Optional[int] = ..., uploaded: _Optional[bool] = ..., id: _Optional[str] = ..., family: _Optional[str] = ..., ref_text: _Optional[str] = ..., sample_duration: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., created: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., consent: _Optional[bool] = ...) -> None: ...

class CreateVoiceRequest(_message.Message):
    __slots__ = ("name", "audio", "ref_text", "model", "language", "description", "consent_audio")
    NAME_FIELD_NUMBER: _ClassVar[int]
    AUDIO_FIELD_NUMBER: _ClassVar[int]
    REF_TEXT_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    LANGUAGE_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    CONSENT_AUDIO_FIELD_NUMBER: _ClassVar[int]
    name: str
    audio: bytes
    ref_text: str
    model: str
    language: str
    description: str
    consent_audio: bytes
    def __init__(self, name: _Optional[str] = ..., audio: _Optional[bytes] = ..., ref_text: _Optional[str] = ..., model: _Optional[str] = ..., language: _Optional[str] = ..., description: _Optional[str] = ..., consent_audio: _Optional[bytes] = ...) -> None: ...

class CreateVoiceResponse(_message.Message):
    __slots__ = ("voice",)
    VOICE_FIELD_NUMBER: _ClassVar[int]
    voice: Voice
    def __init__(self, voice: _Optional[_Union[Voice, _Mapping]] = ...) -> None: ...

class GetVoiceRequest(_message.Message):
    __slots__ = ("id",)
    ID_FIELD_NUMBER: _ClassVar[int]
    id: str
    def __init__(self, id: _Optional[str] = ...) -> None: ...

class GetVoiceResponse(_message.Message):
    __slots__ = ("voice",)
    VOICE_FIELD_NUMBER: _ClassVar[int]
    voice: Voice
    def __init__(self, voice: _Optional[_Union[Voice, _Mapping]] = ...) -> None: ...

class DeleteVoiceRequest(_message.Message):
    __slots__ = ("id",)
    ID_FIELD_NUMBER: _ClassVar[int]
    id: str
    def __init__(self, id: _Optional[str] = ...) -> None: ...

class DeleteVoiceResponse(_message.Message):
    __slots__ = ("id", "name")
    ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    id: str
    name: str
    def __init__(self, id: _Optional[str] = ..., name: _Optional[str] = ...) -> None: ...

class ConverseRequest(_message.Message):
    __slots__ = ("event_id", "session_update", "input_audio_buffer_append", "input_audio_buffer_commit", "response_create", "response_cancel", "conversation_item_truncate")
    EVENT_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_UPDATE_FIELD_NUMBER: _ClassVar[int]
    INPUT_AUDIO_BUFFER_APPEND_FIELD_NUMBER: _ClassVar[int]
    INPUT_AUDIO_BUFFER_COMMIT_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_CREATE_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_CANCEL_FIELD_NUMBER: _ClassVar[int]
    CONVERSATION_ITEM_TRUNCATE_FIELD_NUMBER: _ClassVar[int]
    event_id: str
    session_update: SessionUpdate
    input_audio_buffer_append: InputAudioBufferAppend
    input_audio_buffer_commit: InputAudioBufferCommit
    response_create: ResponseCreate
    response_cancel: ResponseCancel
    conversation_item_truncate: ConversationItemTruncate
    def __init__(self, event_id: _Optional[str] = ..., session_update: _Optional[_Union[SessionUpdate, _Mapping]] = ..., input_audio_buffer_append: _Optional[_Union[InputAudioBufferAppend, _Mapping]] = ..., input_audio_buffer_commit: _Optional[_Union[InputAudioBufferCommit, _Mapping]] = ..., response_create: _Optional[_Union[ResponseCreate, _Mapping]] = ..., response_cancel: _Optional[_Union[ResponseCancel, _Mapping]] = ..., conversation_item_truncate: _Optional[_Union[ConversationItemTruncate, _Mapping]] = ...) -> None: ...

class RealtimeAudioFormat(_message.Message):
    __slots__ = ("encoding", "sample_rate_hz")
    ENCODING_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_RATE_HZ_FIELD_NUMBER: _ClassVar[int]
    encoding: AudioEncoding
    sample_rate_hz: int
    def __init__(self, encoding: _Optional[_Union[AudioEncoding, str]] = ..., sample_rate_hz: _Optional[int] = ...) -> None: ...

class TurnDetection(_message.Message):
    __slots__ = ("type", "create_response", "interrupt_response")
    TYPE_FIELD_NUMBER: _ClassVar[int]
    CREATE_RESPONSE_FIELD_NUMBER: _ClassVar[int]
    INTERRUPT_RESPONSE_FIELD_NUMBER: _ClassVar[int]
    type: TurnDetectionType
    create_response: bool
    interrupt_response: bool
    def __init__(self, type: _Optional[_Union[TurnDetectionType, str]] = ..., create_response: _Optional[bool] = ..., interrupt_response: _Optional[bool] = ...) -> None: ...

class SessionAudioInput(_message.Message):
    __slots__ = ("format", "turn_detection")
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    TURN_DETECTION_FIELD_NUMBER: _ClassVar[int]
    format: RealtimeAudioFormat
    turn_detection: TurnDetection
    def __init__(self, format: _Optional[_Union[RealtimeAudioFormat, _Mapping]] = ..., turn_detection: _Optional[_Union[TurnDetection, _Mapping]] = ...) -> None: ...

class SessionAudioOutput(_message.Message):
    __slots__ = ("format", "voice")
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    VOICE_FIELD_NUMBER: _ClassVar[int]
    format: RealtimeAudioFormat
    voice: str
    def __init__(self, format: _Optional[_Union[RealtimeAudioFormat, _Mapping]] = ..., voice: _Optional[str] = ...) -> None: ...

class SessionAudio(_message.Message):
    __slots__ = ("input", "output")
    INPUT_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_FIELD_NUMBER: _ClassVar[int]
    input: SessionAudioInput
    output: SessionAudioOutput
    def __init__(self, input: _Optional[_Union[SessionAudioInput, _Mapping]] = ..., output: _Optional[_Union[SessionAudioOutput, _Mapping]] = ...) -> None: ...

class Session(_message.Message):
    __slots__ = ("id", "model", "instructions", "audio", "seed", "sampling", "voice_audio")
    ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    INSTRUCTIONS_FIELD_NUMBER: _ClassVar[int]
    AUDIO_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    VOICE_AUDIO_FIELD_NUMBER: _ClassVar[int]
    id: str
    model: str
    instructions: str
    audio: SessionAudio
    seed: int
    sampling: SamplingParams
    voice_audio: bytes
    def __init__(self, id: _Optional[str] = ..., model: _Optional[str] = ..., instructions: _Optional[str] = ..., audio: _Optional[_Union[SessionAudio, _Mapping]] = ..., seed: _Optional[int] = ..., sampling: _Optional[_Union[SamplingParams, _Mapping]] = ..., voice_audio: _Optional[bytes] = ...) -> None: ...

class SessionUpdate(_message.Message):
    __slots__ = ("session",)
    SESSION_FIELD_NUMBER: _ClassVar[int]
    session: Session
    def __init__(self, session: _Optional[_Union[Session, _Mapping]] = ...) -> None: ...

class InputAudioBufferAppend(_message.Message):
    __slots__ = ("audio",)
    AUDIO_FIELD_NUMBER: _ClassVar[int]
    audio: bytes
    def __init__(self, audio: _Optional[bytes] = ...) -> None: ...

class InputAudioBufferCommit(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ResponseCreate(_message.Message):
    __slots__ = ("instructions",)
    INSTRUCTIONS_FIELD_NUMBER: _ClassVar[int]
    instructions: str
    def __init__(self, instructions: _Optional[str] = ...) -> None: ...

class ResponseCancel(_message.Message):
    __slots__ = ("response_id",)
    RESPONSE_ID_FIELD_NUMBER: _ClassVar[int]
    response_id: str
    def __init__(self, response_id: _Optional[str] = ...) -> None: ...

class ConversationItemTruncate(_message.Message):
    __slots__ = ("item_id", "content_index", "audio_end_ms")
    ITEM_ID_FIELD_NUMBER: _ClassVar[int]
    CONTENT_INDEX_FIELD_NUMBER: _ClassVar[int]
    AUDIO_END_MS_FIELD_NUMBER: _ClassVar[int]
    item_id: str
    content_index: int
    audio_end_ms: int
    def __init__(self, item_id: _Optional[str] = ..., content_index: _Optional[int] = ..., audio_end_ms: _Optional[int] = ...) -> None: ...

class ConverseResponse(_message.Message):
    __slots__ = ("event_id", "session_created", "session_updated", "input_audio_buffer_committed", "input_audio_buffer_speech_started", "input_audio_buffer_speech_stopped", "response_created", "response_output_audio_delta", "response_output_audio_transcript_delta", "response_done", "error")
    EVENT_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_CREATED_FIELD_NUMBER: _ClassVar[int]
    SESSION_UPDATED_FIELD_NUMBER: _ClassVar[int]
    INPUT_AUDIO_BUFFER_COMMITTED_FIELD_NUMBER: _ClassVar[int]
    INPUT_AUDIO_BUFFER_SPEECH_STARTED_FIELD_NUMBER: _ClassVar[int]
    INPUT_AUDIO_BUFFER_SPEECH_STOPPED_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_CREATED_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_OUTPUT_AUDIO_DELTA_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_OUTPUT_AUDIO_TRANSCRIPT_DELTA_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_DONE_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    event_id: str
    session_created: SessionCreated
    session_updated: SessionUpdated
    input_audio_buffer_committed: InputAudioBufferCommitted
    input_audio_buffer_speech_started: InputAudioBufferSpeechStarted
    input_audio_buffer_speech_stopped: InputAudioBufferSpeechStopped
    response_created: ResponseCreated
    response_output_audio_delta: ResponseOutputAudioDelta
    response_output_audio_transcript_delta: ResponseOutputAudioTranscriptDelta
    response_done: ResponseDone
    error: RealtimeError
    def __init__(self, event_id: _Optional[str] = ..., session_created: _Optional[_Union[SessionCreated, _Mapping]] = ..., session_updated: _Optional[_Union[SessionUpdated, _Mapping]] = ..., input_audio_buffer_committed: _Optional[_Union[InputAudioBufferCommitted, _Mapping]] = ..., input_audio_buffer_speech_started: _Optional[_Union[InputAudioBufferSpeechStarted, _Mapping]] = ..., input_audio_buffer_speech_stopped: _Optional[_Union[InputAudioBufferSpeechStopped, _Mapping]] = ..., response_created: _Optional[_Union[ResponseCreated, _Mapping]] = ..., response_output_audio_delta: _Optional[_Union[ResponseOutputAudioDelta, _Mapping]] = ..., response_output_audio_transcript_delta: _Optional[_Union[ResponseOutputAudioTranscriptDelta, _Mapping]] = ..., response_done: _Optional[_Union[ResponseDone, _Mapping]] = ..., error: _Optional[_Union[RealtimeError, _Mapping]] = ...) -> None: ...

class SessionCreated(_message.Message):
    __slots__ = ("session",)
    SESSION_FIELD_NUMBER: _ClassVar[int]
    session: Session
    def __init__(self, session: _Optional[_Union[Session, _Mapping]] = ...) -> None: ...

class SessionUpdated(_message.Message):
    __slots__ = ("session",)
    SESSION_FIELD_NUMBER: _ClassVar[int]
    session: Session
    def __init__(self, session: _Optional[_Union[Session, _Mapping]] = ...) -> None: ...

class InputAudioBufferCommitted(_message.Message):
    __slots__ = ("previous_item_id", "item_id")
    PREVIOUS_ITEM_ID_FIELD_NUMBER: _ClassVar[int]
    ITEM_ID_FIELD_NUMBER: _ClassVar[int]
    previous_item_id: str
    item_id: str
    def __init__(self, previous_item_id: _Optional[str] = ..., item_id: _Optional[str] = ...) -> None: ...

class InputAudioBufferSpeechStarted(_message.Message):
    __slots__ = ("audio_start_ms", "item_id")
    AUDIO_START_MS_FIELD_NUMBER: _ClassVar[int]
    ITEM_ID_FIELD_NUMBER: _ClassVar[int]
    audio_start_ms: int
    item_id: str
    def __init__(self, audio_start_ms: _Optional[int] = ..., item_id: _Optional[str] = ...) -> None: ...

class InputAudioBufferSpeechStopped(_message.Message):
    __slots__ = ("audio_end_ms", "item_id")
    AUDIO_END_MS_FIELD_NUMBER: _ClassVar[int]
    ITEM_ID_FIELD_NUMBER: _ClassVar[int]
    audio_end_ms: int
    item_id: str
    def __init__(self, audio_end_ms: _Optional[int] = ..., item_id: _Optional[str] = ...) -> None: ...

class Response(_message.Message):
    __slots__ = ("id", "status", "status_reason", "audio_duration")
    ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    STATUS_REASON_FIELD_NUMBER: _ClassVar[int]
    AUDIO_DURATION_FIELD_NUMBER: _ClassVar[int]
    id: str
    status: ResponseStatus
    status_reason: str
    audio_duration: _duration_pb2.Duration
    def __init__(self, id: _Optional[str] = ..., status: _Optional[_Union[ResponseStatus, str]] = ..., status_reason: _Optional[str] = ..., audio_duration: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class ResponseCreated(_message.Message):
    __slots__ = ("response",)
    RESPONSE_FIELD_NUMBER: _ClassVar[int]
    response: Response
    def __init__(self, response: _Optional[_Union[Response, _Mapping]] = ...) -> None: ...

class ResponseOutputAudioDelta(_message.Message):
    __slots__ = ("response_id", "item_id", "output_index", "content_index", "delta")
    RESPONSE_ID_FIELD_NUMBER: _ClassVar[int]
    ITEM_ID_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_INDEX_FIELD_NUMBER: _ClassVar[int]
    CONTENT_INDEX_FIELD_NUMBER: _ClassVar[int]
    DELTA_FIELD_NUMBER: _ClassVar[int]
    response_id: str
    item_id: str
    output_index: int
    content_index: int
    delta: bytes
    def __init__(self, response_id: _Optional[str] = ..., item_id: _Optional[str] = ..., output_index: _Optional[int] = ..., content_index: _Optional[int] = ..., delta: _Optional[bytes] = ...) -> None: ...

class ResponseOutputAudioTranscriptDelta(_message.Message):
    __slots__ = ("response_id", "item_id", "output_index", "content_index", "delta")
    RESPONSE_ID_FIELD_NUMBER: _ClassVar[int]
    ITEM_ID_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_INDEX_FIELD_NUMBER: _ClassVar[int]
    CONTENT_INDEX_FIELD_NUMBER: _ClassVar[int]
    DELTA_FIELD_NUMBER: _ClassVar[int]
    response_id: str
    item_id: str
    output_index: int
    content_index: int
    delta: str
    def __init__(self, response_id: _Optional[str] = ..., item_id: _Optional[str] = ..., output_index: _Optional[int] = ..., content_index: _Optional[int] = ..., delta: _Optional[str] = ...) -> None: ...

class ResponseDone(_message.Message):
    __slots__ = ("response",)
    RESPONSE_FIELD_NUMBER: _ClassVar[int]
    response: Response
    def __init__(self, response: _Optional[_Union[Response, _Mapping]] = ...) -> None: ...

class RealtimeError(_message.Message):
    __slots__ = ("type", "code", "message", "param", "event_id")
    TYPE_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    PARAM_FIELD_NUMBER: _ClassVar[int]
    EVENT_ID_FIELD_NUMBER: _ClassVar[int]
    type: str
    code: str
    message: str
    param: str
    event_id: str
    def __init__(self, type: _Optional[str] = ..., code: _Optional[str] = ..., message: _Optional[str] = ..., param: _Optional[str] = ..., event_id: _Optional[str] = ...) -> None: ...
