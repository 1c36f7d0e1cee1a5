import datetime

from google.protobuf import duration_pb2 as _duration_pb2
from voxstage.v1 import speech_pb2 as _speech_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class CreditUnit(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CREDIT_UNIT_UNSPECIFIED: _ClassVar[CreditUnit]
    CREDIT_UNIT_FRAMES: _ClassVar[CreditUnit]
    CREDIT_UNIT_SAMPLES: _ClassVar[CreditUnit]

class StreamMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    STREAM_MODE_UNSPECIFIED: _ClassVar[StreamMode]
    STREAM_MODE_TTS: _ClassVar[StreamMode]
    STREAM_MODE_DUPLEX: _ClassVar[StreamMode]

class PcmFormat(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PCM_FORMAT_UNSPECIFIED: _ClassVar[PcmFormat]
    PCM_FORMAT_S16LE: _ClassVar[PcmFormat]
    PCM_FORMAT_F32LE: _ClassVar[PcmFormat]

class EndReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    END_REASON_UNSPECIFIED: _ClassVar[EndReason]
    END_REASON_EOS: _ClassVar[EndReason]
    END_REASON_MAX_FRAMES: _ClassVar[EndReason]
    END_REASON_CANCELLED: _ClassVar[EndReason]
    END_REASON_ERROR: _ClassVar[EndReason]
    END_REASON_FRAME_CAP: _ClassVar[EndReason]

class RequestPhase(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    REQUEST_PHASE_UNSPECIFIED: _ClassVar[RequestPhase]
    REQUEST_PHASE_QUEUED: _ClassVar[RequestPhase]
    REQUEST_PHASE_PREFILL: _ClassVar[RequestPhase]
    REQUEST_PHASE_RUNNING: _ClassVar[RequestPhase]
    REQUEST_PHASE_BLOCKED_ON_CREDIT: _ClassVar[RequestPhase]
    REQUEST_PHASE_WAITING_FOR_INPUT: _ClassVar[RequestPhase]
    REQUEST_PHASE_FINISHED: _ClassVar[RequestPhase]
CREDIT_UNIT_UNSPECIFIED: CreditUnit
CREDIT_UNIT_FRAMES: CreditUnit
CREDIT_UNIT_SAMPLES: CreditUnit
STREAM_MODE_UNSPECIFIED: StreamMode
STREAM_MODE_TTS: StreamMode
STREAM_MODE_DUPLEX: StreamMode
PCM_FORMAT_UNSPECIFIED: PcmFormat
PCM_FORMAT_S16LE: PcmFormat
PCM_FORMAT_F32LE: PcmFormat
END_REASON_UNSPECIFIED: EndReason
END_REASON_EOS: EndReason
END_REASON_MAX_FRAMES: EndReason
END_REASON_CANCELLED: EndReason
END_REASON_ERROR: EndReason
END_REASON_FRAME_CAP: EndReason
REQUEST_PHASE_UNSPECIFIED: RequestPhase
REQUEST_PHASE_QUEUED: RequestPhase
REQUEST_PHASE_PREFILL: RequestPhase
REQUEST_PHASE_RUNNING: RequestPhase
REQUEST_PHASE_BLOCKED_ON_CREDIT: RequestPhase
REQUEST_PHASE_WAITING_FOR_INPUT: RequestPhase
REQUEST_PHASE_FINISHED: RequestPhase

class ShmRef(_message.Message):
    __slots__ = ("region", "offset", "length", "generation", "slot")
    REGION_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    SLOT_FIELD_NUMBER: _ClassVar[int]
    region: str
    offset: int
    length: int
    generation: int
    slot: int
    def __init__(self, region: _Optional[str] = ..., offset: _Optional[int] = ..., length: _Optional[int] = ..., generation: _Optional[int] = ..., slot: _Optional[int] = ...) -> None: ...

class Payload(_message.Message):
    __slots__ = ("inline", "shm")
    INLINE_FIELD_NUMBER: _ClassVar[int]
    SHM_FIELD_NUMBER: _ClassVar[int]
    inline: bytes
    shm: ShmRef
    def __init__(self, inline: _Optional[bytes] = ..., shm: _Optional[_Union[ShmRef, _Mapping]] = ...) -> None: ...

class ShmAck(_message.Message):
    __slots__ = ("refs",)
    REFS_FIELD_NUMBER: _ClassVar[int]
    refs: _containers.RepeatedCompositeFieldContainer[ShmRef]
    def __init__(self, refs: _Optional[_Iterable[_Union[ShmRef, _Mapping]]] = ...) -> None: ...

class TransportHello(_message.Message):
    __slots__ = ("boot_id", "hostname", "pid", "probe_region", "shm_threshold_bytes", "verified_peer_probe")
    BOOT_ID_FIELD_NUMBER: _ClassVar[int]
    HOSTNAME_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    PROBE_REGION_FIELD_NUMBER: _ClassVar[int]
    SHM_THRESHOLD_BYTES_FIELD_NUMBER: _ClassVar[int]
    VERIFIED_PEER_PROBE_FIELD_NUMBER: _ClassVar[int]
    boot_id: str
    hostname: str
    pid: int
    probe_region: str
    shm_threshold_bytes: int
    verified_peer_probe: str
    def __init__(self, boot_id: _Optional[str] = ..., hostname: _Optional[str] = ..., pid: _Optional[int] = ..., probe_region: _Optional[str] = ..., shm_threshold_bytes: _Optional[int] = ..., verified_peer_probe: _Optional[str] = ...) -> None: ...

class Credit(_message.Message):
    __slots__ = ("unit", "amount")
    UNIT_FIELD_NUMBER: _ClassVar[int]
    AMOUNT_FIELD_NUMBER: _ClassVar[int]
    unit: CreditUnit
    amount: int
    def __init__(self, unit: _Optional[_Union[CreditUnit, str]] = ..., amount: _Optional[int] = ...) -> None: ...

class VoiceReference(_message.Message):
    __slots__ = ("audio", "audio_format", "audio_sample_rate_hz", "text", "codes", "x_vector", "x_vector_dim", "voice_key")
    AUDIO_FIELD_NUMBER: _ClassVar[int]
    AUDIO_FORMAT_FIELD_NUMBER: _ClassVar[int]
    AUDIO_SAMPLE_RATE_HZ_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    CODES_FIELD_NUMBER: _ClassVar[int]
    X_VECTOR_FIELD_NUMBER: _ClassVar[int]
    X_VECTOR_DIM_FIELD_NUMBER: _ClassVar[int]
    VOICE_KEY_FIELD_NUMBER: _ClassVar[int]
    audio: Payload
    audio_format: PcmFormat
    audio_sample_rate_hz: int
    text: str
    codes: CodecFrames
    x_vector: Payload
    x_vector_dim: int
    voice_key: str
    def __init__(self, audio: _Optional[_Union[Payload, _Mapping]] = ..., audio_format: _Optional[_Union[PcmFormat, str]] = ..., audio_sample_rate_hz: _Optional[int] = ..., text: _Optional[str] = ..., codes: _Optional[_Union[CodecFrames, _Mapping]] = ..., x_vector: _Optional[_Union[Payload, _Mapping]] = ..., x_vector_dim: _Optional[int] = ..., voice_key: _Optional[str] = ...) -> None: ...

class ChunkSchedule(_message.Message):
    __slots__ = ("initial_chunk_frames", "steady_chunk_frames", "left_context_frames")
    INITIAL_CHUNK_FRAMES_FIELD_NUMBER: _ClassVar[int]
    STEADY_CHUNK_FRAMES_FIELD_NUMBER: _ClassVar[int]
    LEFT_CONTEXT_FRAMES_FIELD_NUMBER: _ClassVar[int]
    initial_chunk_frames: int
    steady_chunk_frames: int
    left_context_frames: int
    def __init__(self, initial_chunk_frames: _Optional[int] = ..., steady_chunk_frames: _Optional[int] = ..., left_context_frames: _Optional[int] = ...) -> None: ...

class StreamOpen(_message.Message):
    __slots__ = ("request_id", "mode", "talker_address", "model", "voice", "language", "instructions", "seed", "sampling", "subtalker_sampling", "non_streaming_mode", "text_deltas", "initial_text", "initial_end_of_input", "whole_clip", "reference", "chunk_schedule", "pcm_format", "sample_rate_hz", "initial_credit", "transport")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    TALKER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VOICE_FIELD_NUMBER: _ClassVar[int]
    LANGUAGE_FIELD_NUMBER: _ClassVar[int]
    INSTRUCTIONS_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    SUBTALKER_SAMPLING_FIELD_NUMBER: _ClassVar[int]
    NON_STREAMING_MODE_FIELD_NUMBER: _ClassVar[int]
    TEXT_DELTAS_FIELD_NUMBER: _ClassVar[int]
    INITIAL_TEXT_FIELD_NUMBER: _ClassVar[int]
    INITIAL_END_OF_INPUT_FIELD_NUMBER: _ClassVar[int]
    WHOLE_CLIP_FIELD_NUMBER: _ClassVar[int]
    REFERENCE_FIELD_NUMBER: _ClassVar[int]
    CHUNK_SCHEDULE_FIELD_NUMBER: _ClassVar[int]
    PCM_FORMAT_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_RATE_HZ_FIELD_NUMBER: _ClassVar[int]
    INITIAL_CREDIT_FIELD_NUMBER: _ClassVar[int]
    TRANSPORT_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    mode: StreamMode
    talker_address: str
    model: str
    voice: str
    language: str
    instructions: str
    seed: int
    sampling: _speech_pb2.SamplingParams
    subtalker_sampling: _speech_pb2.SubtalkerSamplingParams
    non_streaming_mode: bool
    text_deltas: bool
    initial_text: str
    initial_end_of_input: bool
    whole_clip: bool
    reference: VoiceReference
    chunk_schedule: ChunkSchedule
    pcm_format: PcmFormat
    sample_rate_hz: int
    initial_credit: Credit
    transport: TransportHello
    def __init__(self, request_id: _Optional[str] = ..., mode: _Optional[_Union[StreamMode, str]] = ..., talker_address: _Optional[str] = ..., model: _Optional[str] = ..., voice: _Optional[str] = ..., language: _Optional[str] = ..., instructions: _Optional[str] = ..., seed: _Optional[int] = ..., sampling: _Optional[_Union[_speech_pb2.SamplingParams, _Mapping]] = ..., subtalker_sampling: _Optional[_Union[_speech_pb2.SubtalkerSamplingParams, _Mapping]] = ..., non_streaming_mode: _Optional[bool] = ..., text_deltas: _Optional[bool] = ..., initial_text: _Optional[str] = ..., initial_end_of_input: _Optional[bool] = ..., whole_clip: _Optional[bool] = ..., reference: _Optional[_Union[VoiceReference, _Mapping]] = ..., chunk_schedule: _Optional[_Union[ChunkSchedule, _Mapping]] = ..., pcm_format: _Optional[_Union[PcmFormat, str]] = ..., sample_rate_hz: _Optional[int] = ..., initial_credit: _Optional[_Union[Credit, _Mapping]] = ..., transport: _Optional[_Union[TransportHello, _Mapping]] = ...) -> None: ...

class StreamOpened(_message.Message):
    __slots__ = ("request_id", "model", "family", "num_code_groups", "frame_rate_hz", "pcm_format", "sample_rate_hz", "channels", "chunk_schedule", "initial_credit", "transport")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    FAMILY_FIELD_NUMBER: _ClassVar[int]
    NUM_CODE_GROUPS_FIELD_NUMBER: _ClassVar[int]
    FRAME_RATE_HZ_FIELD_NUMBER: _ClassVar[int]
    PCM_FORMAT_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_RATE_HZ_FIELD_NUMBER: _ClassVar[int]
    CHANNELS_FIELD_NUMBER: _ClassVar[int]
    CHUNK_SCHEDULE_FIELD_NUMBER: _ClassVar[int]
    INITIAL_CREDIT_FIELD_NUMBER: _ClassVar[int]
    TRANSPORT_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    model: str
    family: str
    num_code_groups: int
    frame_rate_hz: float
    pcm_format: PcmFormat
    sample_rate_hz: int
    channels: int
    chunk_schedule: ChunkSchedule
    initial_credit: Credit
    transport: TransportHello
    def __init__(self, request_id: _Optional[str] = ..., model: _Optional[str] = ..., family: _Optional[str] = ..., num_code_groups: _Optional[int] = ..., frame_rate_hz: _Optional[float] = ..., pcm_format: _Optional[_Union[PcmFormat, str]] = ..., sample_rate_hz: _Optional[int] = ..., channels: _Optional[int] = ..., chunk_schedule: _Optional[_Union[ChunkSchedule, _Mapping]] = ..., initial_credit: _Optional[_Union[Credit, _Mapping]] = ..., transport: _Optional[_Union[TransportHello, _Mapping]] = ...) -> None: ...

class Flush(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class EndOfInput(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Cancel(_message.Message):
    __slots__ = ("reason",)
    REASON_FIELD_NUMBER: _ClassVar[int]
    reason: str
    def __init__(self, reason: _Optional[str] = ...) -> None: ...

class CodecFrames(_message.Message):
    __slots__ = ("first_frame", "frame_count", "num_groups", "codes", "segment_index", "text_tokens", "transcript_delta", "sent_unix_ns", "user_frame")
    FIRST_FRAME_FIELD_NUMBER: _ClassVar[int]
    FRAME_COUNT_FIELD_NUMBER: _ClassVar[int]
    NUM_GROUPS_FIELD_NUMBER: _ClassVar[int]
    CODES_FIELD_NUMBER: _ClassVar[int]
    SEGMENT_INDEX_FIELD_NUMBER: _ClassVar[int]
    TEXT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TRANSCRIPT_DELTA_FIELD_NUMBER: _ClassVar[int]
    SENT_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    USER_FRAME_FIELD_NUMBER: _ClassVar[int]
    first_frame: int
    frame_count: int
    num_groups: int
    codes: Payload
    segment_index: int
    text_tokens: bytes
    transcript_delta: str
    sent_unix_ns: int
    user_frame: int
    def __init__(self, first_frame: _Optional[int] = ..., frame_count: _Optional[int] = ..., num_groups: _Optional[int] = ..., codes: _Optional[_Union[Payload, _Mapping]] = ..., segment_index: _Optional[int] = ..., text_tokens: _Optional[bytes] = ..., transcript_delta: _Optional[str] = ..., sent_unix_ns: _Optional[int] = ..., user_frame: _Optional[int] = ...) -> None: ...

class PcmChunk(_message.Message):
    __slots__ = ("sample_offset", "sample_count", "format", "data", "segment_index", "first_frame", "frame_count", "transcript_delta", "sent_unix_ns", "user_frame")
    SAMPLE_OFFSET_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_COUNT_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    SEGMENT_INDEX_FIELD_NUMBER: _ClassVar[int]
    FIRST_FRAME_FIELD_NUMBER: _ClassVar[int]
    FRAME_COUNT_FIELD_NUMBER: _ClassVar[int]
    TRANSCRIPT_DELTA_FIELD_NUMBER: _ClassVar[int]
    SENT_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    USER_FRAME_FIELD_NUMBER: _ClassVar[int]
    sample_offset: int
    sample_count: int
    format: PcmFormat
    data: Payload
    segment_index: int
    first_frame: int
    frame_count: int
    transcript_delta: str
    sent_unix_ns: int
    user_frame: int
    def __init__(self, sample_offset: _Optional[int] = ..., sample_count: _Optional[int] = ..., format: _Optional[_Union[PcmFormat, str]] = ..., data: _Optional[_Union[Payload, _Mapping]] = ..., segment_index: _Optional[int] = ..., first_frame: _Optional[int] = ..., frame_count: _Optional[int] = ..., transcript_delta: _Optional[str] = ..., sent_unix_ns: _Optional[int] = ..., user_frame: _Optional[int] = ...) -> None: ...

class SegmentDone(_message.Message):
    __slots__ = ("segment_index", "frame_count", "sample_count", "reason")
    SEGMENT_INDEX_FIELD_NUMBER: _ClassVar[int]
    FRAME_COUNT_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_COUNT_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    segment_index: int
    frame_count: int
    sample_count: int
    reason: EndReason
    def __init__(self, segment_index: _Optional[int] = ..., frame_count: _Optional[int] = ..., sample_count: _Optional[int] = ..., reason: _Optional[_Union[EndReason, str]] = ...) -> None: ...

class StreamError(_message.Message):
    __slots__ = ("code", "message", "origin")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    ORIGIN_FIELD_NUMBER: _ClassVar[int]
    code: int
    message: str
    origin: str
    def __init__(self, code: _Optional[int] = ..., message: _Optional[str] = ..., origin: _Optional[str] = ...) -> None: ...

class StageTimings(_message.Message):
    __slots__ = ("queued", "first_output", "total")
    QUEUED_FIELD_NUMBER: _ClassVar[int]
    FIRST_OUTPUT_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    queued: _duration_pb2.Duration
    first_output: _duration_pb2.Duration
    total: _duration_pb2.Duration
    def __init__(self, queued: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., first_output: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., total: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class EndOfStream(_message.Message):
    __slots__ = ("reason", "frame_count", "sample_count", "timings", "error")
    REASON_FIELD_NUMBER: _ClassVar[int]
    FRAME_COUNT_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_COUNT_FIELD_NUMBER: _ClassVar[int]
    TIMINGS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    reason: EndReason
    frame_count: int
    sample_count: int
    timings: StageTimings
    error: StreamError
    def __init__(self, reason: _Optional[_Union[EndReason, str]] = ..., frame_count: _Optional[int] = ..., sample_count: _Optional[int] = ..., timings: _Optional[_Union[StageTimings, _Mapping]] = ..., error: _Optional[_Union[StreamError, _Mapping]] = ...) -> None: ...

class CodecStreamRequest(_message.Message):
    __slots__ = ("open", "text", "flush", "end_of_input", "credit", "user_audio", "cancel", "shm_ack")
    OPEN_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    FLUSH_FIELD_NUMBER: _ClassVar[int]
    END_OF_INPUT_FIELD_NUMBER: _ClassVar[int]
    CREDIT_FIELD_NUMBER: _ClassVar[int]
    USER_AUDIO_FIELD_NUMBER: _ClassVar[int]
    CANCEL_FIELD_NUMBER: _ClassVar[int]
    SHM_ACK_FIELD_NUMBER: _ClassVar[int]
    open: StreamOpen
    text: str
    flush: Flush
    end_of_input: EndOfInput
    credit: Credit
    user_audio: PcmChunk
    cancel: Cancel
    shm_ack: ShmAck
    def __init__(self, open: _Optional[_Union[StreamOpen, _Mapping]] = ..., text: _Optional[str] = ..., flush: _Optional[_Union[Flush, _Mapping]] = ..., end_of_input: _Optional[_Union[EndOfInput, _Mapping]] = ..., credit: _Optional[_Union[Credit, _Mapping]] = ..., user_audio: _Optional[_Union[PcmChunk, _Mapping]] = ..., cancel: _Optional[_Union[Cancel, _Mapping]] = ..., shm_ack: _Optional[_Union[ShmAck, _Mapping]] = ...) -> None: ...

class CodecStreamResponse(_message.Message):
    __slots__ = ("opened", "pcm", "segment_done", "credit", "end_of_stream", "shm_ack")
    OPENED_FIELD_NUMBER: _ClassVar[int]
    PCM_FIELD_NUMBER: _ClassVar[int]
    SEGMENT_DONE_FIELD_NUMBER: _ClassVar[int]
    CREDIT_FIELD_NUMBER: _ClassVar[int]
    END_OF_STREAM_FIELD_NUMBER: _ClassVar[int]
    SHM_ACK_FIELD_NUMBER: _ClassVar[int]
    opened: StreamOpened
    pcm: PcmChunk
    segment_done: SegmentDone
    credit: Credit
    end_of_stream: EndOfStream
    shm_ack: ShmAck
    def __init__(self, opened: _Optional[_Union[StreamOpened, _Mapping]] = ..., pcm: _Optional[_Union[PcmChunk, _Mapping]] = ..., segment_done: _Optional[_Union[SegmentDone, _Mapping]] = ..., credit: _Optional[_Union[Credit, _Mapping]] = ..., end_of_stream: _Optional[_Union[EndOfStream, _Mapping]] = ..., shm_ack: _Optional[_Union[ShmAck, _Mapping]] = ...) -> None: ...

class TalkerStreamRequest(_message.Message):
    __slots__ = ("open", "text", "flush", "end_of_input", "credit", "user_codes", "cancel", "shm_ack")
    OPEN_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    FLUSH_FIELD_NUMBER: _ClassVar[int]
    END_OF_INPUT_FIELD_NUMBER: _ClassVar[int]
    CREDIT_FIELD_NUMBER: _ClassVar[int]
    USER_CODES_FIELD_NUMBER: _ClassVar[int]
    CANCEL_FIELD_NUMBER: _ClassVar[int]
    SHM_ACK_FIELD_NUMBER: _ClassVar[int]
    open: StreamOpen
    text: str
    flush: Flush
    end_of_input: EndOfInput
    credit: Credit
    user_codes: CodecFrames
    cancel: Cancel
    shm_ack: ShmAck
    def __init__(self, open: _Optional[_Union[StreamOpen, _Mapping]] = ..., text: _Optional[str] = ..., flush: _Optional[_Union[Flush, _Mapping]] = ..., end_of_input: _Optional[_Union[EndOfInput, _Mapping]] = ..., credit: _Optional[_Union[Credit, _Mapping]] = ..., user_codes: _Optional[_Union[CodecFrames, _Mapping]] = ..., cancel: _Optional[_Union[Cancel, _Mapping]] = ..., shm_ack: _Optional[_Union[ShmAck, _Mapping]] = ...) -> None: ...

class TalkerStreamResponse(_message.Message):
    __slots__ = ("opened", "frames", "segment_done", "credit", "end_of_stream", "shm_ack")
    OPENED_FIELD_NUMBER: _ClassVar[int]
    FRAMES_FIELD_NUMBER: _ClassVar[int]
    SEGMENT_DONE_FIELD_NUMBER: _ClassVar[int]
    CREDIT_FIELD_NUMBER: _ClassVar[int]
    END_OF_STREAM_FIELD_NUMBER: _ClassVar[int]
    SHM_ACK_FIELD_NUMBER: _ClassVar[int]
    opened: StreamOpened
    frames: CodecFrames
    segment_done: SegmentDone
    credit: Credit
    end_of_stream: EndOfStream
    shm_ack: ShmAck
    def __init__(self, opened: _Optional[_Union[StreamOpened, _Mapping]] = ..., frames: _Optional[_Union[CodecFrames, _Mapping]] = ..., segment_done: _Optional[_Union[SegmentDone, _Mapping]] = ..., credit: _Optional[_Union[Credit, _Mapping]] = ..., end_of_stream: _Optional[_Union[EndOfStream, _Mapping]] = ..., shm_ack: _Optional[_Union[ShmAck, _Mapping]] = ...) -> None: ...

class LinkBatch(_message.Message):
    __slots__ = ("items", "body", "shm_ack", "hello")
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    BODY_FIELD_NUMBER: _ClassVar[int]
    SHM_ACK_FIELD_NUMBER: _ClassVar[int]
    HELLO_FIELD_NUMBER: _ClassVar[int]
    items: bytes
    body: Payload
    shm_ack: ShmAck
    hello: TransportHello
    def __init__(self, items: _Optional[bytes] = ..., body: _Optional[_Union[Payload, _Mapping]] = ..., shm_ack: _Optional[_Union[ShmAck, _Mapping]] = ..., hello: _Optional[_Union[TransportHello, _Mapping]] = ...) -> None: ...

class CodecLinkRequest(_message.Message):
    __slots__ = ("batch",)
    BATCH_FIELD_NUMBER: _ClassVar[int]
    batch: LinkBatch
    def __init__(self, batch: _Optional[_Union[LinkBatch, _Mapping]] = ...) -> None: ...

class CodecLinkResponse(_message.Message):
    __slots__ = ("batch",)
    BATCH_FIELD_NUMBER: _ClassVar[int]
    batch: LinkBatch
    def __init__(self, batch: _Optional[_Union[LinkBatch, _Mapping]] = ...) -> None: ...

class TalkerLinkRequest(_message.Message):
    __slots__ = ("batch",)
    BATCH_FIELD_NUMBER: _ClassVar[int]
    batch: LinkBatch
    def __init__(self, batch: _Optional[_Union[LinkBatch, _Mapping]] = ...) -> None: ...

class TalkerLinkResponse(_message.Message):
    __slots__ = ("batch",)
    BATCH_FIELD_NUMBER: _ClassVar[int]
    batch: LinkBatch
    def __init__(self, batch: _Optional[_Union[LinkBatch, _Mapping]] = ...) -> None: ...

class RequestState(_message.Message):
    __slots__ = ("request_id", "phase", "slot", "frame_count", "credit", "shm_slots_lent", "last_tick")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    SLOT_FIELD_NUMBER: _ClassVar[int]
    FRAME_COUNT_FIELD_NUMBER: _ClassVar[int]
    CREDIT_FIELD_NUMBER: _ClassVar[int]
    SHM_SLOTS_LENT_FIELD_NUMBER: _ClassVar[int]
    LAST_TICK_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    phase: RequestPhase
    slot: int
    frame_count: int
    credit: int
    shm_slots_lent: int
    last_tick: int
    def __init__(self, request_id: _Optional[str] = ..., phase: _Optional[_Union[RequestPhase, str]] = ..., slot: _Optional[int] = ..., frame_count: _Optional[int] = ..., credit: _Optional[int] = ..., shm_slots_lent: _Optional[int] = ..., last_tick: _Optional[int] = ...) -> None: ...

class StageStatus(_message.Message):
    __slots__ = ("ready", "model", "family", "slots_total", "slots_in_use", "active_streams", "queue_depth", "tick", "requests", "transport", "num_code_groups", "frame_rate_hz", "sample_rate_hz", "max_model_len", "text_token_limit", "text_tokens_per_byte", "reference_positions_per_second", "duplex", "catalog", "link")
    READY_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    FAMILY_FIELD_NUMBER: _ClassVar[int]
    SLOTS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    SLOTS_IN_USE_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_STREAMS_FIELD_NUMBER: _ClassVar[int]
    QUEUE_DEPTH_FIELD_NUMBER: _ClassVar[int]
    TICK_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    TRANSPORT_FIELD_NUMBER: _ClassVar[int]
    NUM_CODE_GROUPS_FIELD_NUMBER: _ClassVar[int]
    FRAME_RATE_HZ_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_RATE_HZ_FIELD_NUMBER: _ClassVar[int]
    MAX_MODEL_LEN_FIELD_NUMBER: _ClassVar[int]
    TEXT_TOKEN_LIMIT_FIELD_NUMBER: _ClassVar[int]
    TEXT_TOKENS_PER_BYTE_FIELD_NUMBER: _ClassVar[int]
    REFERENCE_POSITIONS_PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    DUPLEX_FIELD_NUMBER: _ClassVar[int]
    CATALOG_FIELD_NUMBER: _ClassVar[int]
    LINK_FIELD_NUMBER: _ClassVar[int]
    ready: bool
    model: str
    family: str
    slots_total: int
    slots_in_use: int
    active_streams: int
    queue_depth: int
    tick: int
    requests: _containers.RepeatedCompositeFieldContainer[RequestState]
    transport: TransportHello
    num_code_groups: int
    frame_rate_hz: float
    sample_rate_hz: int
    max_model_len: int
    text_token_limit: int
    text_tokens_per_byte: float
    reference_positions_per_second: float
    duplex: bool
    catalog: ModelCatalog
    link: bool
    def __init__(self, ready: _Optional[bool] = ..., model: _Optional[str] = ..., family: _Optional[str] = ..., slots_total: _Optional[int] = ..., slots_in_use: _Optional[int] = ..., active_streams: _Optional[int] = ..., queue_depth: _Optional[int] = ..., tick: _Optional[int] = ..., requests: _Optional[_Iterable[_Union[RequestState, _Mapping]]] = ..., transport: _Optional[_Union[TransportHello, _Mapping]] = ..., num_code_groups: _Optional[int] = ..., frame_rate_hz: _Optional[float] = ..., sample_rate_hz: _Optional[int] = ..., max_model_len: _Optional[int] = ..., text_token_limit: _Optional[int] = ..., text_tokens_per_byte: _Optional[float] = ..., reference_positions_per_second: _Optional[float] = ..., duplex: _Optional[bool] = ..., catalog: _Optional[_Union[ModelCatalog, _Mapping]] = ..., link: _Optional[bool] = ...) -> None: ...

class ModelCatalog(_message.Message):
    __slots__ = ("voices", "languages", "variant", "voice_clone", "reference_required", "reference_text_required", "instructions", "voice_required")
    VOICES_FIELD_NUMBER: _ClassVar[int]
    LANGUAGES_FIELD_NUMBER: _ClassVar[int]
    VARIANT_FIELD_NUMBER: _ClassVar[int]
    VOICE_CLONE_FIELD_NUMBER: _ClassVar[int]
    REFERENCE_REQUIRED_FIELD_NUMBER: _ClassVar[int]
    REFERENCE_TEXT_REQUIRED_FIELD_NUMBER: _ClassVar[int]
    INSTRUCTIONS_FIELD_NUMBER: _ClassVar[int]
    VOICE_REQUIRED_FIELD_NUMBER: _ClassVar[int]
    voices: _containers.RepeatedCompositeFieldContainer[CatalogVoice]
    languages: _containers.RepeatedScalarFieldContainer[str]
    variant: str
    voice_clone: bool
    reference_required: bool
    reference_text_required: bool
    instructions: bool
    voice_required: bool
    def __init__(self, voices: _Optional[_Iterable[_Union[CatalogVoice, _Mapping]]] = ..., languages: _Optional[_Iterable[str]] = ..., variant: _Optional[str] = ..., voice_clone: _Optional[bool] = ..., reference_required: _Optional[bool] = ..., reference_text_required: _Optional[bool] = ..., instructions: _Optional[bool] = ..., voice_required: _Optional[bool] = ...) -> None: ...

class CatalogVoice(_message.Message):
    __slots__ = ("name", "languages", "description")
    NAME_FIELD_NUMBER: _ClassVar[int]
    LANGUAGES_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    name: str
    languages: _containers.RepeatedScalarFieldContainer[str]
    description: str
    def __init__(self, name: _Optional[str] = ..., languages: _Optional[_Iterable[str]] = ..., description: _Optional[str] = ...) -> None: ...

class EncodeVoiceRequest(_message.Message):
    __slots__ = ("model", "reference")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    REFERENCE_FIELD_NUMBER: _ClassVar[int]
    model: str
    reference: VoiceReference
    def __init__(self, model: _Optional[str] = ..., reference: _Optional[_Union[VoiceReference, _Mapping]] = ...) -> None: ...

class EncodeVoiceResponse(_message.Message):
    __slots__ = ("reference",)
    REFERENCE_FIELD_NUMBER: _ClassVar[int]
    reference: VoiceReference
    def __init__(self, reference: _Optional[_Union[VoiceReference, _Mapping]] = ...) -> None: ...

class CodecStatusRequest(_message.Message):
    __slots__ = ("include_requests",)
    INCLUDE_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    include_requests: bool
    def __init__(self, include_requests: _Optional[bool] = ...) -> None: ...

class CodecStatusResponse(_message.Message):
    __slots__ = ("status",)
    STATUS_FIELD_NUMBER: _ClassVar[int]
    status: StageStatus
    def __init__(self, status: _Optional[_Union[StageStatus, _Mapping]] = ...) -> None: ...

class TalkerStatusRequest(_message.Message):
    __slots__ = ("include_requests",)
    INCLUDE_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    include_requests: bool
    def __init__(self, include_requests: _Optional[bool] = ...) -> None: ...

class TalkerStatusResponse(_message.Message):
    __slots__ = ("status",)
    STATUS_FIELD_NUMBER: _ClassVar[int]
    status: StageStatus
    def __init__(self, status: _Optional[_Union[StageStatus, _Mapping]] = ...) -> None: ...
