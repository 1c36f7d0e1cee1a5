"""``SpeechClient``: the blocking client, for scripts and threads without an event loop.

It uses gRPC's synchronous stack directly (a streaming call's requests are drawn by a gRPC thread from a
generator that waits on a condition variable), with the same retry rule as the async client.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc

from voxstage.client._async import CHANNEL_OPTIONS
from voxstage.client._common import (
    Audio,
    AudioChunk,
    RetryPolicy,
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
from voxstage.client._converse import ConverseSession
from voxstage.client._converse_common import session_update
from voxstage.v1 import speech_pb2, speech_pb2_grpc

_END = object()


class StreamingSession:
    """Blocking twin of ``AsyncStreamingSession``: ``push_text`` / ``flush`` / ``end_input`` / ``close``, and
    iterate for chunks (from this thread or another one)."""

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
        self._cond = threading.Condition()
        self._call: Any = None
        self._closed = False
        self.info: StreamInfo | None = None
        self.summary: speech_pb2.SynthesisSummary | None = None

    def push_text(self, text: str) -> None:
        self._add(speech_pb2.StreamingSynthesizeRequest(text=text))

    def flush(self) -> None:
        self._add(speech_pb2.StreamingSynthesizeRequest(flush=speech_pb2.Flush()))

    def end_input(self) -> None:
        self._add(_END)

    def _add(self, item: Any) -> None:
        with self._cond:
            if self._items and self._items[-1] is _END:
                raise RuntimeError("end_input() was already called")
            self._items.append(item)
            self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if self._call is not None:
            self._call.cancel()

    def __enter__(self) -> StreamingSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _requests(self) -> Iterator[speech_pb2.StreamingSynthesizeRequest]:
        yield speech_pb2.StreamingSynthesizeRequest(config=self._config)
        sent = 0
        while True:
            with self._cond:
                while sent >= len(self._items) and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
                item = self._items[sent]
            sent += 1
            if item is _END:
                return
            yield item

    def __iter__(self) -> Iterator[AudioChunk]:
        attempt = 1
        got_audio = False
        while True:
            timeout = None if self._deadline is None else max(self._deadline - time.monotonic(), 0.001)
            self._call = self._stub.StreamingSynthesize(self._requests(), timeout=timeout)
            try:
                for reply in self._call:
                    kind = reply.WhichOneof("response")
                    if kind == "started":
                        self.info = stream_info(reply.started)
                    elif kind == "audio":
                        got_audio = True
                        a = reply.audio
                        yield AudioChunk(a.data, a.sample_offset, a.segment_index)
                    elif kind == "summary":
                        self.summary = reply.summary
                return
            except grpc.RpcError as exc:
                if self._closed and exc.code() is grpc.StatusCode.CANCELLED:  # type: ignore[attr-defined]
                    return
                err = error_from_rpc(exc)
                delay = None if got_audio else self._retry.delay(attempt, err)
                if delay is None:
                    raise err from None
            attempt += 1
            time.sleep(delay)


class SpeechClient:
    """Blocking client; same methods and options as ``AsyncSpeechClient``."""

    def __init__(
        self,
        address: str = "localhost:50051",
        *,
        timeout: float | None = 60.0,
        retry: RetryPolicy | None = None,
        channel: grpc.Channel | None = None,
        api_key: str | None = None,
        tls: bool = False,
        root_certificates: bytes | str | Path | None = None,
    ) -> None:
        self._own_channel = channel is None
        self._channel = channel or open_channel(
            address, CHANNEL_OPTIONS, tls=tls, root_certificates=root_certificates, aio=False
        )
        self._stub = make_stub(speech_pb2_grpc.SpeechStub(self._channel), api_key)
        self.timeout = timeout
        self.retry = retry or RetryPolicy()

    def close(self) -> None:
        if self._own_channel:
            self._channel.close()

    def __enter__(self) -> SpeechClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def synthesize(
        self, text: str, *, encoding: str = "wav", timeout: float | None = None, **options: Any
    ) -> Audio:
        request = speech_pb2.SynthesizeRequest(config=build_config(encoding=encoding, **options), text=text)
        limit = timeout if timeout is not None else self.timeout
        deadline = None if limit is None else time.monotonic() + limit
        attempt = 1
        while True:
            remaining = None if deadline is None else max(deadline - time.monotonic(), 0.001)
            try:
                return audio_from(self._stub.Synthesize(request, timeout=remaining))
            except grpc.RpcError as exc:
                err = error_from_rpc(exc)
                delay = self.retry.delay(attempt, err)
                if delay is None:
                    raise err from None
            attempt += 1
            time.sleep(delay)

    def session(
        self, *, encoding: str = "pcm", timeout: float | None = None, **options: Any
    ) -> StreamingSession:
        config = build_config(encoding=encoding, **options)
        return StreamingSession(self._stub, config, timeout=timeout or self.timeout, retry=self.retry)

    def stream(
        self, text: str, *, encoding: str = "pcm", timeout: float | None = None, **options: Any
    ) -> Iterator[AudioChunk]:
        session = self.session(encoding=encoding, timeout=timeout, **options)
        session.push_text(text)
        session.end_input()
        try:
            yield from session
        finally:
            session.close()

    def synthesize_streamed(self, text: str, *, encoding: str = "pcm", **options: Any) -> Audio:
        session = self.session(encoding=encoding, **options)
        session.push_text(text)
        session.end_input()
        start = time.monotonic()
        chunks: list[AudioChunk] = []
        ttfa = 0.0
        for chunk in session:
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
        timeout: float | None = None,
        **options: Any,
    ) -> ConverseSession:
        """A full-duplex session (``with``); the same options as ``AsyncSpeechClient.converse``."""
        update = session_update(
            voice=voice,
            instructions=instructions,
            input_format=input_format,
            output_format=output_format,
            **options,
        )
        return ConverseSession(self._stub, update, timeout=timeout, retry=self.retry)

    def list_voices(self, *, model: str = "", language: str = "") -> list[Voice]:
        try:
            reply = self._stub.ListVoices(
                speech_pb2.ListVoicesRequest(model=model, language=language), timeout=self.timeout
            )
        except grpc.RpcError as exc:
            raise error_from_rpc(exc) from None
        return voices_from(reply)

    def create_voice(
        self, name: str, audio: bytes | str | Path, *, ref_text: str = "", **options: Any
    ) -> Voice:
        """Upload a voice to the gateway's voice library: ``audio`` is a sample recording (an audio file's
        bytes or path) and ``ref_text`` its transcript; ``options``: ``model``, ``language``,
        ``description``, ``consent_audio``. Then name it (or its ``id``) as ``voice`` anywhere."""
        request = create_voice_request(name, audio, ref_text=ref_text, **options)
        try:
            reply = self._stub.CreateVoice(request, timeout=self.timeout)
        except grpc.RpcError as exc:
            raise error_from_rpc(exc) from None
        return voice_from(reply.voice)

    def get_voice(self, voice: str) -> Voice:
        """An uploaded voice, by id or name."""
        try:
            reply = self._stub.GetVoice(speech_pb2.GetVoiceRequest(id=voice), timeout=self.timeout)
        except grpc.RpcError as exc:
            raise error_from_rpc(exc) from None
        return voice_from(reply.voice)

    def delete_voice(self, voice: str) -> str:
        """Remove an uploaded voice (by id or name); returns its id."""
        try:
            reply = self._stub.DeleteVoice(speech_pb2.DeleteVoiceRequest(id=voice), timeout=self.timeout)
        except grpc.RpcError as exc:
            raise error_from_rpc(exc) from None
        return reply.id
