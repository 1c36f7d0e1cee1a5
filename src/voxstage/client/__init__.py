"""Python SDK for voxstage's public gRPC API (``voxstage.v1.Speech``).

::

    from voxstage.client import SpeechClient

    with SpeechClient("localhost:50051") as client:
        client.synthesize("Hello!", voice="serena").save("hello.wav")

``AsyncSpeechClient`` has the same methods as coroutines / async iterators. ``converse(...)`` opens a
full-duplex speech-to-speech session (``session_mode: duplex`` deployments). Both retry UNAVAILABLE and
RESOURCE_EXHAUSTED only before the first audio chunk (see ``RetryPolicy``) and raise ``SpeechError``.
"""

from voxstage.client._async import AsyncSpeechClient, AsyncStreamingSession
from voxstage.client._common import Audio, AudioChunk, RetryPolicy, SpeechError, StreamInfo, Voice
from voxstage.client._converse import AsyncConverseSession, ConverseSession
from voxstage.client._converse_common import (
    AgentAudio,
    AgentTranscript,
    ConverseEvent,
    ResponseDone,
    ServerNotice,
    SessionInfo,
)
from voxstage.client._sync import SpeechClient, StreamingSession

__all__ = [
    "AgentAudio",
    "AgentTranscript",
    "AsyncConverseSession",
    "AsyncSpeechClient",
    "AsyncStreamingSession",
    "Audio",
    "AudioChunk",
    "ConverseEvent",
    "ConverseSession",
    "ResponseDone",
    "ServerNotice",
    "SessionInfo",
    "RetryPolicy",
    "SpeechClient",
    "SpeechError",
    "StreamInfo",
    "StreamingSession",
    "Voice",
]
