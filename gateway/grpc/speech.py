"""The public gRPC face: ``voxstage.v1.Speech``.

``Synthesize`` returns the whole clip (any encoding, Ogg/Opus included); ``StreamingSynthesize`` takes a
config first, then text deltas and flushes, and streams audio in the streamable encodings; ``ListVoices``
reads the catalog; ``Converse`` runs a full-duplex session (``grpc.converse``) when the deployment has
``session_mode: duplex``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeAlias

import grpc
import numpy as np
from google.protobuf import duration_pb2

from gateway.accounting import RequestAccounting
from gateway.checks import resolve_model
from gateway.core import GatewayCore
from gateway.errors import GatewayError, abort, as_gateway_error, invalid
from gateway.grpc.converse import converse
from gateway.quotas import STREAM, client_of
from gateway.tts.request import (
    GRPC_FIELDS,
    RawRequest,
    SynthesisJob,
    build_job,
    check_text,
    reference_from_grpc,
)
from gateway.tts.stream_watch import StreamWatch
from gateway.tts.synthesis import FLUSH, AudioOut, Finished, InputItem, SegmentEnd, Started, whole_text
from gateway.voices.library import VoiceUpload
from gateway.voices.views import listing, uploaded_voice
from voxstage import formats
from voxstage.audio import AudioError, AudioFormat, StreamingEncoder, encode_clip
from voxstage.v1 import speech_pb2, speech_pb2_grpc

# gRPC's spelling of the one format table (voxstage.formats), shared with HTTP, the SDK and the CLI.
ENCODINGS: dict[int, AudioFormat] = {f.encoding: AudioFormat(f.name) for f in formats.FORMATS}
Context: TypeAlias = grpc.aio.ServicerContext[Any, Any]


def _no_release() -> None:
    pass


def _duration(seconds: float) -> duration_pb2.Duration:
    d = duration_pb2.Duration()
    d.FromNanoseconds(int(max(seconds, 0.0) * 1e9))
    return d


def _deadline(context: Context, limit: float | None = None) -> float | None:
    """The client's deadline (monotonic), or ``limit`` when that comes first."""
    remaining = context.time_remaining()
    client = None if remaining is None else time.monotonic() + remaining
    if limit is None:
        return client
    return limit if client is None else min(client, limit)


FINISH_REASONS = {
    "end_of_speech": speech_pb2.FINISH_REASON_END_OF_SPEECH,
    "max_frames": speech_pb2.FINISH_REASON_MAX_FRAMES,
    "frame_cap": speech_pb2.FINISH_REASON_FRAME_CAP,
}


def _summary(done: Finished, ttfa_s: float | None = None) -> speech_pb2.SynthesisSummary:
    """``ttfa_s`` overrides ``done.ttfa_s``, which a whole clip leaves unset (its first byte is its last)."""
    return speech_pb2.SynthesisSummary(
        request_id=done.request_id,
        finish_reason=FINISH_REASONS[done.finish],
        segment_count=done.segments,
        sample_count=done.samples,
        frame_count=done.frames,
        audio_duration=_duration(done.audio_s),
        time_to_first_audio=_duration(done.ttfa_s if ttfa_s is None else ttfa_s),
        total_duration=_duration(done.total_s),
    )


class SpeechServicer(speech_pb2_grpc.SpeechServicer):
    def __init__(self, core: GatewayCore) -> None:
        self.core = core

    async def _job(
        self, config: speech_pb2.SynthesisConfig, *, streaming: bool, text: str = ""
    ) -> SynthesisJob:
        enc = config.encoding
        if enc == speech_pb2.AUDIO_ENCODING_UNSPECIFIED:
            raise invalid("config.encoding", "AUDIO_ENCODING_UNSPECIFIED is not allowed; choose an encoding")
        fmt = ENCODINGS.get(enc)
        if fmt is None:
            raise invalid("config.encoding", f"unknown encoding value {enc}")
        if streaming and not fmt.streamable:
            usable = ", ".join(
                f.encoding_name.removeprefix("AUDIO_ENCODING_") for f in formats.FORMATS if f.streams
            )
            raise invalid(
                "config.encoding",
                f"{speech_pb2.AudioEncoding.Name(enc)} cannot be streamed; use {usable}, or call Synthesize "
                "for a whole clip",
                reason="unsupported_format",
            )
        raw = RawRequest(
            fmt=fmt,
            model=config.model,
            voice=config.voice,
            language=config.language,
            instructions=config.instructions,
            sample_rate=config.sample_rate_hz,
            seed=config.seed if config.HasField("seed") else None,
            sampling=config.sampling,
            subtalker=config.subtalker_sampling,
            reference=reference_from_grpc(config.reference_audio)
            if config.HasField("reference_audio")
            else None,
            initial_chunk_frames=config.chunk_schedule.initial_chunk_frames,
            steady_chunk_frames=config.chunk_schedule.steady_chunk_frames,
            non_streaming=config.non_streaming_mode,
        )
        gw = self.core.config.gateway
        return await build_job(
            raw,
            self.core.model,
            GRPC_FIELDS,
            max_text_chars=gw.max_text_chars,
            voice_aliases=gw.voice_aliases,
            text=text,
            max_frames_limit=self.core.config.max_frames_limit,
            voices=self.core.voices,
        )

    async def Synthesize(
        self, request: speech_pb2.SynthesizeRequest, context: Context
    ) -> speech_pb2.SynthesizeResponse:
        acct = RequestAccounting("grpc_synthesize", whole_clip=True)
        acct.deadline = _deadline(context)
        first_pcm: float | None = None
        release = _no_release
        try:
            release = self.core.quotas.acquire(*client_of(context), STREAM)
            if not request.HasField("config"):
                raise invalid("config", "required (encoding at least)")
            check_text(request.text, "text", self.core.config.gateway.max_text_chars)
            job = await self._job(request.config, streaming=False, text=request.text)
            parts: list[np.ndarray] = []
            summary: Finished | None = None
            run = self.core.synth.run(job, whole_text(request.text), acct, deadline=acct.deadline)
            async with contextlib.aclosing(run) as events:
                async for event in events:
                    if isinstance(event, AudioOut):
                        if first_pcm is None and event.pcm.size:
                            first_pcm = time.monotonic()
                        parts.append(event.pcm)
                    elif isinstance(event, Finished):
                        summary = event
            pcm = np.concatenate(parts) if parts else np.zeros(0, np.float32)
            try:
                audio = encode_clip(pcm, job.fmt, job.sample_rate)
            except AudioError as exc:
                raise invalid("config.encoding", str(exc)) from None
        except Exception as exc:
            err = as_gateway_error(exc)
            acct.finish(err.outcome, code=err.code.name)
            await abort(context, err)
            raise AssertionError("unreachable") from None  # abort() raises
        finally:
            release()
        acct.clip_sent()
        assert summary is not None
        # The clip's first byte leaves with its last, so the summary reports when its first audio was ready
        # at the gateway, from the same origin as the metric (work start, else arrival).
        origin = acct.work_started if acct.work_started is not None else acct.arrival
        ttfa = None if first_pcm is None else first_pcm - origin
        return speech_pb2.SynthesizeResponse(
            audio=audio,
            encoding=request.config.encoding,
            sample_rate_hz=job.sample_rate,
            channels=1,
            summary=_summary(summary, ttfa),
        )

    async def StreamingSynthesize(
        self, request_iterator: AsyncIterator[speech_pb2.StreamingSynthesizeRequest], context: Context
    ) -> AsyncIterator[speech_pb2.StreamingSynthesizeResponse]:
        try:
            release = self.core.quotas.acquire(*client_of(context), STREAM)
        except GatewayError as err:
            RequestAccounting("grpc_streaming").finish(err.outcome, code=err.code.name)
            await abort(context, err)
            return
        try:
            async with contextlib.aclosing(self._streaming(request_iterator, context)) as responses:
                async for response in responses:
                    yield response
        finally:
            release()

    async def _streaming(
        self, request_iterator: AsyncIterator[speech_pb2.StreamingSynthesizeRequest], context: Context
    ) -> AsyncIterator[speech_pb2.StreamingSynthesizeResponse]:
        acct = RequestAccounting("grpc_streaming")
        acct.deadline = _deadline(context)
        gw = self.core.config.gateway
        try:
            try:
                # Even before it holds anything, a call waiting for a config that never comes is idle.
                first = await asyncio.wait_for(anext(aiter(request_iterator), None), gw.stream_idle_timeout_s)
            except TimeoutError:
                raise GatewayError(
                    grpc.StatusCode.DEADLINE_EXCEEDED,
                    f"nothing from the client for {gw.stream_idle_timeout_s:g} s "
                    "(gateway.stream_idle_timeout_s); send config first",
                    field="config",
                    reason="stream_idle_timeout",
                ) from None
            if first is None:
                raise invalid("config", "the stream ended before any message; send config first")
            kind = first.WhichOneof("request")
            if kind != "config":
                raise invalid(
                    "config", f"the first message must carry config, got {kind or 'an empty message'}"
                )
            job = await self._job(first.config, streaming=True)
        except Exception as exc:
            err = as_gateway_error(exc)
            acct.finish(err.outcome, code=err.code.name)
            await abort(context, err)
            return
        encoder = StreamingEncoder(job.fmt, job.sample_rate)
        # Idle timeout and lifetime limit (gateway/tts/stream_watch.py): without them a client that never
        # sends text nor half-closes holds its admission slot and codec stream forever.
        watch = StreamWatch(gw.stream_idle_timeout_s, gw.max_stream_lifetime_s)
        inputs = watch.inputs(_inputs(request_iterator))
        run = self.core.synth.run(
            job, inputs, acct, deadline=_deadline(context, watch.expires_at), watch=watch, text_deltas=True
        )
        guard = asyncio.create_task(watch.guard(run))
        finished = False
        position = _Position()
        try:
            try:
                async for event in run:
                    if watch.error is not None:
                        break  # expired while this event was on its way: write nothing more
                    taken = True
                    for response in _responses(event, job, first.config.encoding, encoder, position):
                        watch.writing()
                        yield response
                        if not (taken := await watch.written()):
                            break
                    if not taken:
                        break  # the watch ended the run while the client was not taking this response
                    finished = isinstance(event, Finished)
            finally:
                guard.cancel()
                await watch.close(run, finished=finished)
            if watch.error is not None and not finished:
                raise watch.error
        except Exception as exc:
            await abort(context, as_gateway_error(exc))

    async def ListVoices(
        self, request: speech_pb2.ListVoicesRequest, context: Context
    ) -> speech_pb2.ListVoicesResponse:
        try:
            model = resolve_model(request.model, self.core.model, "model")
        except GatewayError as exc:
            await abort(context, exc)
            raise AssertionError("unreachable") from None
        return speech_pb2.ListVoicesResponse(voices=listing(model, request.language, self.core.voices))

    async def CreateVoice(  # noqa: N802 - gRPC method name
        self, request: speech_pb2.CreateVoiceRequest, context: Context
    ) -> speech_pb2.CreateVoiceResponse:
        up = VoiceUpload(
            name=request.name, audio=request.audio, ref_text=request.ref_text, model=request.model,
            language=request.language, description=request.description,
            consent_audio=request.consent_audio or None,
        )  # fmt: skip

        async def create() -> Any:
            if not request.audio:
                raise invalid("audio", "required: the sample recording (an audio file)")
            return await self.core.voices.create(up, self.core.model)

        meta = await _answer(context, create)
        return speech_pb2.CreateVoiceResponse(voice=uploaded_voice(meta, self.core.model))

    async def GetVoice(  # noqa: N802 - gRPC method name
        self, request: speech_pb2.GetVoiceRequest, context: Context
    ) -> speech_pb2.GetVoiceResponse:
        async def get() -> Any:
            return self.core.voices.get(request.id)

        meta = await _answer(context, get)
        return speech_pb2.GetVoiceResponse(voice=uploaded_voice(meta, self.core.model))

    async def DeleteVoice(  # noqa: N802 - gRPC method name
        self, request: speech_pb2.DeleteVoiceRequest, context: Context
    ) -> speech_pb2.DeleteVoiceResponse:
        meta = await _answer(context, lambda: self.core.voices.delete(request.id, self.core.model))
        return speech_pb2.DeleteVoiceResponse(id=meta.id, name=meta.name)

    async def Converse(
        self, request_iterator: AsyncIterator[speech_pb2.ConverseRequest], context: Context
    ) -> None:
        await converse(self.core, request_iterator, context)


async def _inputs(
    request_iterator: AsyncIterator[speech_pb2.StreamingSynthesizeRequest],
) -> AsyncIterator[InputItem]:
    async for msg in request_iterator:
        kind = msg.WhichOneof("request")
        if kind == "text":
            yield msg.text
        elif kind == "flush":
            yield FLUSH
        elif kind == "config":
            raise GatewayError(
                grpc.StatusCode.FAILED_PRECONDITION,
                "config may only be sent once, first",
                field="config",
                reason="config_repeated",
            )
        else:
            raise invalid("request", "empty message: set config, text or flush")


@dataclass
class _Position:
    """Where the next audio chunk starts: after the last one, in the last segment."""

    sample_offset: int = 0
    segment_index: int = 0


def _responses(
    event: Started | AudioOut | SegmentEnd | Finished,
    job: SynthesisJob,
    encoding: speech_pb2.AudioEncoding,
    encoder: StreamingEncoder,
    position: _Position,
) -> list[speech_pb2.StreamingSynthesizeResponse]:
    """What one event becomes on the wire: nothing for audio an encoder still holds (MP3, Opus), and the
    encoder's last bytes as one more audio chunk before the summary."""
    if isinstance(event, AudioOut):
        position.sample_offset = event.sample_offset + event.pcm.size
        position.segment_index = event.segment_index
        data = encoder.encode(event.pcm)
        if not data:
            return []
        chunk = speech_pb2.AudioChunk(
            data=data, sample_offset=event.sample_offset, segment_index=event.segment_index
        )
        return [speech_pb2.StreamingSynthesizeResponse(audio=chunk)]
    if isinstance(event, Started):
        started = speech_pb2.StreamStarted(
            request_id=event.request_id,
            encoding=encoding,
            sample_rate_hz=event.sample_rate,
            channels=1,
            model=event.model,
            voice=event.voice,
        )
        return [speech_pb2.StreamingSynthesizeResponse(started=started)]
    if isinstance(event, SegmentEnd):
        done = speech_pb2.SegmentDone(
            segment_index=event.index,
            sample_count=event.samples,
            time_to_first_audio=_duration(event.ttfa_s),
            duration=_duration(event.duration_s),
            finish_reason=FINISH_REASONS[event.finish],
        )
        return [speech_pb2.StreamingSynthesizeResponse(segment_done=done)]
    out = []
    if tail := encoder.close():
        chunk = speech_pb2.AudioChunk(
            data=tail, sample_offset=position.sample_offset, segment_index=position.segment_index
        )
        out.append(speech_pb2.StreamingSynthesizeResponse(audio=chunk))
    return [*out, speech_pb2.StreamingSynthesizeResponse(summary=_summary(event))]


async def _answer(context: Context, call: Callable[[], Awaitable[Any]]) -> Any:
    """A voice-resource call's result, or the call ended with the status its error maps to."""
    try:
        return await call()
    except Exception as exc:
        await abort(context, as_gateway_error(exc))
        raise AssertionError("unreachable") from None
