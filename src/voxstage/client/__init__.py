"""Python SDK for voxstage's public gRPC API (``voxstage.v1.Speech``).

::

    from voxstage.client import SpeechClient

    with SpeechClient("localhost:50051") as client:
        client.synthesize("Hello!", voice="serena").save("hello.wav")

``AsyncSpeechClient`` has the same methods as coroutines / async iterators. Both retry UNAVAILABLE and
RESOURCE_EXHAUSTED only before the first audio chunk (see ``RetryPolicy``) and raise ``SpeechError``.
"""

from voxstage.client._async import AsyncSpeechClient, AsyncStreamingSession
from voxstage.client._common import Audio, AudioChunk, RetryPolicy, SpeechError, StreamInfo, Voice
from voxstage.client._sync import SpeechClient, StreamingSession

__all__ = [
    "AsyncSpeechClient",
    "AsyncStreamingSession",
    "Audio",
    "AudioChunk",
    "RetryPolicy",
    "SpeechClient",
    "SpeechError",
    "StreamInfo",
    "StreamingSession",
    "Voice",
]
