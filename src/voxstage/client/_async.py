"""``AsyncSpeechClient``: the asyncio client for ``voxstage.v1.Speech``."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc

from voxstage.client._common import (
    Audio,
    AudioChunk,
    RetryPolicy,
    SpeechError,
    StreamInfo,
    Voice,
    audio_from,
    build_config,
    create_voice_request,
    error_from_rpc,
    make_stub,
    open_channel,
    stream_info,
    voice_from,
    voices_from,
)
from voxstage.client._converse import AsyncConverseSession
from voxstage.client._converse_common import session_update
from voxstage.v1 import speech_pb2, speech_pb2_grpc

CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
    ("grpc.max_send_message_length", 64 * 1024 * 1024),
    # The SDK retries by its own rule (before the first audio chunk only); gRPC's would not know it.
    ("grpc.enable_retries", 0),
]
_END = object()


class AsyncStreamingSession:
    """Streamed text in, audio chunks out: ``push_text`` / ``flush`` / ``end_input``, then iterate.

    Until the first audio chunk arrives, every input is kept so a retryable failure can replay it on a
    new call; afterwards failures are raised. Iterating ends after the server's summary.

    Text is held back until the server's ``started`` (the request was admitted): grpc.aio replaces the
    server's status with ``INTERNAL: Internal error from Core`` when a write races the server ending the
    call (grpc/grpc#36066), which would turn a retryable refusal into an error that is not. It costs one
    round trip to the gateway before the text leaves.
    """

    def __init__(
        self,
        stub: speech_pb2_grpc.SpeechStub,
        config: speech_pb2.SynthesisConfig,
        *,
        timeout: float | None,
        retry: RetryPolicy,
    ) -> None:
        self._stub = stub
        self._config = config
        self._deadline = None if timeout is None else time.monotonic() + timeout
        self._retry = retry
        self._items: list[Any] = []
        self._changed = asyncio.Event()
        self._started = asyncio.Event()
        self._call: Any = None
        self._closed = False
        self.info: StreamInfo | None = None
        self.summary: speech_pb2.SynthesisSummary | None = None

    async def push_text(self, text: str) -> None:
        self._add(speech_pb2.StreamingSynthesizeRequest(text=text))

    async def flush(self) -> None:
        self._add(speech_pb2.StreamingSynthesizeRequest(flush=speech_pb2.Flush()))

    async def end_input(self) -> None:
        self._add(_END)

    def _add(self, item: Any) -> None:
        if self._items and self._items[-1] is _END:
            raise RuntimeError("end_input() was already called")
        self._items.append(item)
        self._changed.set()

    async def aclose(self) -> None:
        """Cancel the call (if audio is still coming, the server stops generating it)."""
        self._closed = True
        if self._call is not None:
            self._call.cancel()

    async def __aenter__(self) -> AsyncStreamingSession:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _requests(self) -> AsyncIterator[speech_pb2.StreamingSynthesizeRequest]:
        yield speech_pb2.StreamingSynthesizeRequest(config=self._config)
        await self._started.wait()
        sent = 0
        while True:
            while sent < len(self._items):
                item = self._items[sent]
                sent += 1
                if item is _END:
                    return  # half-close: end of input
                yield item
            self._changed.clear()
            await self._changed.wait()

    def _timeout(self) -> float | None:
        return None if self._deadline is None else max(self._deadline - time.monotonic(), 0.001)

    def __aiter__(self) -> AsyncIterator[AudioChunk]:
        return self._chunks()

    async def _chunks(self) -> AsyncIterator[AudioChunk]:
        attempt = 1
        got_audio = False
        while True:
            self._started = asyncio.Event()
            self._call = self._stub.StreamingSynthesize(self._requests(), timeout=self._timeout())
            try:
                async for reply in self._call:
                    kind = reply.WhichOneof("response")
                    if kind == "started":
                        self.info = stream_info(reply.started)
                        self._started.set()
                    elif kind == "audio":
                        got_audio = True
                        a = reply.audio
                        yield AudioChunk(a.data, a.sample_offset, a.segment_index)
                    elif kind == "summary":
                        self.summary = reply.summary
                return
            except grpc.aio.AioRpcError as exc:
                if self._closed and exc.code() is grpc.StatusCode.CANCELLED:
                    return
                err = error_from_rpc(exc)
                delay = None if got_audio else self._retry.delay(attempt, err)
                if delay is None:
                    raise err from None
            attempt += 1
            await asyncio.sleep(delay)


class AsyncSpeechClient:
    """Async client. ``timeout`` is each call's default deadline in seconds (None: no deadline)."""

    def __init__(
        self,
        address: str = "localhost:50051",
        *,
        timeout: float | None = 60.0,
        retry: RetryPolicy | None = None,
        channel: grpc.aio.Channel | None = None,
        api_key: str | None = None,
        tls: bool = False,
        root_certificates: bytes | str | Path | None = None,
    ) -> None:
        self._own_channel = channel is None
        self._channel = channel or open_channel(
            address, CHANNEL_OPTIONS, tls=tls, root_certificates=root_certificates, aio=True
        )
        self._stub = make_stub(speech_pb2_grpc.SpeechStub(self._channel), api_key)
        self.timeout = timeout
        self.retry = retry or RetryPolicy()

    async def close(self) -> None:
        if self._own_channel:
            await self._channel.close()

    async def __aenter__(self) -> AsyncSpeechClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def synthesize(
        self,
        text: str,
        *,
        encoding: str = "wav",
        timeout: float | None = None,  # noqa: ASYNC109 - a gRPC deadline the server sees, not a local wait
        **options: Any,
    ) -> Audio:
        """The whole clip in one response. Options: voice, model, language, instructions, sample_rate, seed,
        temperature, top_k, top_p, repetition_penalty, max_frames, reference_audio (+ _text, _encoding,
        _sample_rate)."""
        request = speech_pb2.SynthesizeRequest(config=build_config(encoding=encoding, **options), text=text)
        limit = timeout if timeout is not None else self.timeout
        deadline = None if limit is None else time.monotonic() + limit
        attempt = 1
        while True:
            remaining = None if deadline is None else max(deadline - time.monotonic(), 0.001)
            try:
                return audio_from(await self._stub.Synthesize(request, timeout=remaining))
            except grpc.aio.AioRpcError as exc:
                err = error_from_rpc(exc)
                delay = self.retry.delay(attempt, err)
                if delay is None:
                    raise err from None
            attempt += 1
            await asyncio.sleep(delay)

    def session(
        self, *, encoding: str = "pcm", timeout: float | None = None, **options: Any
    ) -> AsyncStreamingSession:
        """A streaming-text session (same options as ``synthesize``; streamable encodings only)."""
        config = build_config(encoding=encoding, **options)
        return AsyncStreamingSession(self._stub, config, timeout=timeout or self.timeout, retry=self.retry)

    async def stream(
        self,
        text: str,
        *,
        encoding: str = "pcm",
        timeout: float | None = None,  # noqa: ASYNC109 - a gRPC deadline the server sees, not a local wait
        **options: Any,
    ) -> AsyncIterator[AudioChunk]:
        """Audio chunks of ``text`` as they are produced."""
        session = self.session(encoding=encoding, timeout=timeout, **options)
        await session.push_text(text)
        await session.end_input()
        try:
            async for chunk in session:
                yield chunk
        finally:
            await session.aclose()

    async def synthesize_streamed(self, text: str, *, encoding: str = "pcm", **options: Any) -> Audio:
        """Like ``synthesize`` but over the streaming RPC; the clip keeps its chunks and measured TTFA."""
        session = self.session(encoding=encoding, **options)
        await session.push_text(text)
        await session.end_input()
        start = time.monotonic()
        chunks: list[AudioChunk] = []
        ttfa = 0.0
        async for chunk in session:
            ttfa = ttfa or time.monotonic() - start
            chunks.append(chunk)
        assert session.info is not None
        return Audio(
            b"".join(c.data for c in chunks),
            session.info.encoding,
            session.info.sample_rate,
            session.info.channels,
            session.info.request_id,
            ttfa,
            chunks,
        )

    def converse(
        self,
        *,
        voice: str = "",
        instructions: str = "",
        input_format: str = "pcm",
        output_format: str = "pcm",
        timeout: float | None = None,  # noqa: ASYNC109 - a gRPC deadline the server sees, not a local wait
        **options: Any,
    ) -> AsyncConverseSession:
        """A full-duplex speech-to-speech session (``async with``). ``voice`` is a stored voice name,
        ``instructions`` the persona; formats are ``pcm`` (24 kHz s16le), ``pcmu`` or ``pcma`` (8 kHz G.711).
        Options: model, seed, temperature, top_k, top_p, voice_audio (a WAV/FLAC/OGG file's bytes: the
        voice to speak with instead of a stored one). No deadline by default: the server closes idle and
        over-long sessions itself."""
        update = session_update(
            voice=voice,
            instructions=instructions,
            input_format=input_format,
            output_format=output_format,
            **options,
        )
        return AsyncConverseSession(self._stub, update, timeout=timeout, retry=self.retry)

    async def list_voices(self, *, model: str = "", language: str = "") -> list[Voice]:
        try:
            reply = await self._stub.ListVoices(
                speech_pb2.ListVoicesRequest(model=model, language=language), timeout=self.timeout
            )
        except grpc.aio.AioRpcError as exc:
            raise error_from_rpc(exc) from None
        return voices_from(reply)

    async def create_voice(
        self, name: str, audio: bytes | str | Path, *, ref_text: str = "", **options: Any
    ) -> Voice:
        """Upload a voice to the gateway's voice library: ``audio`` is a sample recording (an audio file's
        bytes or path) and ``ref_text`` its transcript; ``options``: ``model``, ``language``,
        ``description``, ``consent_audio``. Then name it (or its ``id``) as ``voice`` anywhere."""
        request = create_voice_request(name, audio, ref_text=ref_text, **options)
        try:
            reply = await self._stub.CreateVoice(request, timeout=self.timeout)
        except grpc.aio.AioRpcError as exc:
            raise error_from_rpc(exc) from None
        return voice_from(reply.voice)

    async def get_voice(self, voice: str) -> Voice:
        """An uploaded voice, by id or name."""
        try:
            reply = await self._stub.GetVoice(speech_pb2.GetVoiceRequest(id=voice), timeout=self.timeout)
        except grpc.aio.AioRpcError as exc:
            raise error_from_rpc(exc) from None
        return voice_from(reply.voice)

    async def delete_voice(self, voice: str) -> str:
        """Remove an uploaded voice (by id or name); returns its id."""
        try:
            request = speech_pb2.DeleteVoiceRequest(id=voice)
            reply = await self._stub.DeleteVoice(request, timeout=self.timeout)
        except grpc.aio.AioRpcError as exc:
            raise error_from_rpc(exc) from None
        return reply.id


__all__ = ["AsyncSpeechClient", "AsyncStreamingSession", "SpeechError"]
