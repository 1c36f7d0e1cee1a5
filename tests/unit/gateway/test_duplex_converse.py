"""``Speech.Converse`` against a duplex codec double: concurrent sessions, in-band errors, statuses, clocks,
metrics, and the TTS refusal of a duplex-only model."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import grpc
import numpy as np
import pytest
from duplex_fakes import FakeDuplexCodec, FakeDuplexTalker, stored_voices
from gateway_kit import MakeStack, Stack
from gateway_kit import until as wait_until

from voxstage import metrics
from voxstage.v1 import speech_pb2

FRAME_BYTES = 1920 * 2
PCM = speech_pb2.AUDIO_ENCODING_PCM_S16LE


def tone(seconds: float) -> bytes:
    t = np.arange(int(seconds * 24_000)) / 24_000
    return (0.3 * np.sin(2 * np.pi * 220 * t) * 32767).astype("<i2").tobytes()


def append(data: bytes, event_id: str = "") -> speech_pb2.ConverseRequest:
    return speech_pb2.ConverseRequest(
        event_id=event_id, input_audio_buffer_append=speech_pb2.InputAudioBufferAppend(audio=data)
    )


def update(event_id: str = "", **fields: Any) -> speech_pb2.ConverseRequest:
    return speech_pb2.ConverseRequest(
        event_id=event_id, session_update=speech_pb2.SessionUpdate(session=speech_pb2.Session(**fields))
    )


class Caller:
    """One Converse call: a request queue and the responses as they come."""

    def __init__(self, stack: Stack) -> None:
        self.queue: asyncio.Queue[speech_pb2.ConverseRequest | None] = asyncio.Queue()
        self.call = stack.stub.Converse(self._requests())

    async def _requests(self) -> AsyncIterator[speech_pb2.ConverseRequest]:
        while (item := await self.queue.get()) is not None:
            yield item

    def send(self, *requests: speech_pb2.ConverseRequest) -> None:
        for r in requests:
            self.queue.put_nowait(r)

    async def next(self, kind: str | None = None, within: float = 5.0) -> speech_pb2.ConverseResponse:
        async with asyncio.timeout(within):
            while True:
                reply = await self.call.read()
                assert reply is not grpc.aio.EOF, f"ended before {kind}"
                if kind is None or reply.WhichOneof("event") == kind:
                    return reply

    async def rest(self, within: float = 5.0) -> list[speech_pb2.ConverseResponse]:
        out = []
        async with asyncio.timeout(within):
            while (reply := await self.call.read()) is not grpc.aio.EOF:
                out.append(reply)
        return out


async def test_two_sessions_and_a_clean_close(make_duplex_stack: MakeStack) -> None:
    stack = await make_duplex_stack()
    codec: FakeDuplexCodec = stack.codec  # type: ignore[assignment]
    seconds = 1.6

    async def converse(persona: str) -> list[speech_pb2.ConverseResponse]:
        c = Caller(stack)
        created = (await c.next("session_created")).session_created.session
        assert created.id.startswith("sess_") and created.audio.output.format.encoding == PCM
        c.send(update(instructions=persona, seed=3, sampling=speech_pb2.SamplingParams(temperature=0.7)))
        updated = (await c.next("session_updated")).session_updated.session
        assert updated.instructions == persona and updated.seed == 3
        data = tone(seconds)
        t0 = time.monotonic()
        got: list[speech_pb2.ConverseResponse] = []
        for i, off in enumerate(range(0, len(data), FRAME_BYTES)):  # 80 ms frames at 12.5 Hz
            await asyncio.sleep(max(t0 + i * 0.08 - time.monotonic(), 0))
            c.send(append(data[off : off + FRAME_BYTES]))
        c.send(None)  # half-close: end the session cleanly
        got = await c.rest()
        assert await c.call.code() is grpc.StatusCode.OK
        return got

    answered = metrics.REGISTRY.get_sample_value("voxstage_duplex_response_latency_seconds_count") or 0
    joins = {p: join_count(p) for p in ("open", "first_audio")}
    a, b = await asyncio.gather(converse("You are Ann."), converse("You are Bob."))
    # Each session's join is observed once per phase: the stages' admission, then to its first agent audio.
    assert {p: join_count(p) - n for p, n in joins.items()} == {"open": 2, "first_audio": 2}
    # Every agent frame answered a user frame: each one's latency was observed, last byte in to audio out.
    latency = metrics.REGISTRY.get_sample_value("voxstage_duplex_response_latency_seconds_count")
    assert latency == answered + 40
    for replies in (a, b):
        kinds = [r.WhichOneof("event") for r in replies]
        audio = [r.response_output_audio_delta for r in replies if r.HasField("response_output_audio_delta")]
        text = [
            r.response_output_audio_transcript_delta.delta
            for r in replies
            if r.HasField("response_output_audio_transcript_delta")
        ]  # noqa: E501
        assert kinds[0] == "response_created" and kinds[-1] == "response_done"
        assert len(audio) == 20 and all(len(d.delta) == FRAME_BYTES for d in audio)
        assert text == [f"w{i} " for i in range(20)]
        done = replies[-1].response_done.response
        assert done.status == speech_pb2.RESPONSE_STATUS_COMPLETED and done.id == audio[0].response_id
        assert abs(done.audio_duration.ToNanoseconds() / 1e9 - seconds) < 1e-6
    assert codec.end_of_inputs == 2 and codec.cancels == 0 and codec.protocol_errors == []
    assert sorted(op.instructions for op in codec.opens) == ["You are Ann.", "You are Bob."]
    assert all(op.seed == 3 and op.sampling.temperature == pytest.approx(0.7) for op in codec.opens)
    assert not stack.gateway.core.sessions.live


async def test_bad_input_is_answered_in_band(make_duplex_stack: MakeStack) -> None:
    stack = await make_duplex_stack()
    c = Caller(stack)
    await c.next("session_created")
    mulaw = speech_pb2.RealtimeAudioFormat(encoding=speech_pb2.AUDIO_ENCODING_MULAW, sample_rate_hz=16_000)
    wav = speech_pb2.RealtimeAudioFormat(encoding=speech_pb2.AUDIO_ENCODING_WAV)
    vad = speech_pb2.TurnDetection(type=speech_pb2.TURN_DETECTION_TYPE_SERVER_VAD)
    prefix = "session_update.session"
    commit = speech_pb2.InputAudioBufferCommit()
    cases = [
        (append(b"\x01\x02\x03", "e1"), "invalid_audio", "input_audio_buffer_append.audio"),
        (append(b"", "e2"), "invalid_audio", "input_audio_buffer_append.audio"),
        (append(b"\x00" * (512 * 1024 + 2), "e3"), "invalid_audio", "input_audio_buffer_append.audio"),
        (speech_pb2.ConverseRequest(event_id="e4"), "invalid_event", "event"),
        (speech_pb2.ConverseRequest(event_id="e5", response_create=speech_pb2.ResponseCreate()),
         "unsupported_event", "response_create"),
        (speech_pb2.ConverseRequest(event_id="e6", input_audio_buffer_commit=commit),
         "unsupported_event", "input_audio_buffer_commit"),
        (update("e7", audio=speech_pb2.SessionAudio(input=speech_pb2.SessionAudioInput(format=mulaw))),
         "unsupported_format", f"{prefix}.audio.input.format.sample_rate_hz"),
        (update("e8", audio=speech_pb2.SessionAudio(output=speech_pb2.SessionAudioOutput(format=wav))),
         "unsupported_format", f"{prefix}.audio.output.format.encoding"),
        (update("e9", audio=speech_pb2.SessionAudio(input=speech_pb2.SessionAudioInput(turn_detection=vad))),
         "unsupported_parameter", f"{prefix}.audio.input.turn_detection.type"),
        (update("e10", sampling=speech_pb2.SamplingParams(top_p=1.5)),
         "invalid_value", f"{prefix}.sampling.top_p"),
        (update("e11", sampling=speech_pb2.SamplingParams(max_frames=10)),
         "unsupported_parameter", f"{prefix}.sampling.max_frames"),
        (update("e12", model="tts-1"), "model_not_found", f"{prefix}.model"),
        (update("e13", instructions="x" * 5000), "text_too_long", f"{prefix}.instructions"),
    ]  # fmt: skip
    for request, code, param in cases:
        c.send(request)
        error = (await c.next("error")).error
        assert (error.code, error.param, error.event_id) == (code, param, request.event_id)
        assert error.type == "invalid_request_error" and error.message
    c.send(append(tone(0.08)))
    await c.next("response_output_audio_delta")
    c.send(update("late", instructions="too late"))
    error = (await c.next("error")).error
    assert error.code == "session_already_started" and error.event_id == "late"
    c.send(None)
    assert (await c.rest())[-1].HasField("response_done")
    assert await c.call.code() is grpc.StatusCode.OK


async def test_admission_and_stage_refusal_are_statuses(make_duplex_stack: MakeStack) -> None:
    stack = await make_duplex_stack(overrides=["duplex_session.max_sessions=1"])
    refused = metrics.DUPLEX_REFUSED.labels(reason="max_sessions")._value.get()
    first = Caller(stack)
    await first.next("session_created")
    assert metrics.REGISTRY.get_sample_value("voxstage_duplex_sessions") == 1
    second = Caller(stack)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await second.next()
    assert err.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "duplex_session.max_sessions 1" in (err.value.details() or "")
    assert metrics.DUPLEX_REFUSED.labels(reason="max_sessions")._value.get() == refused + 1
    first.send(append(tone(0.08)))
    await first.next("response_output_audio_delta")
    first.call.cancel()  # the client vanishes mid-session: its codec stream ends at once, its slot is freed
    codec: FakeDuplexCodec = stack.codec  # type: ignore[assignment]
    # grpc.aio ends a cancelled call's request stream (a half-close to the handler) before it cancels the
    # handler, so the codec gets `cancel`, or `end_of_input` when that is out first: exactly one of them.
    await wait_until(
        lambda: (
            not stack.gateway.core.sessions.live
            and codec.cancels + codec.end_of_inputs == 1
            and not codec.active
        )
    )
    codec.refuse = True  # the talker has no free slot: the refusal comes at the first audio
    third = Caller(stack)
    await third.next("session_created")
    third.send(append(tone(0.08)))
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await third.rest()
    assert err.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED and "(from talker)" in (
        err.value.details() or ""
    )
    assert not stack.gateway.core.sessions.live


async def test_a_stage_failure_mid_session_ends_with_its_status(make_duplex_stack: MakeStack) -> None:
    stack = await make_duplex_stack(FakeDuplexCodec(fail_after_frames=3))
    c = Caller(stack)
    await c.next("session_created")
    c.send(append(tone(0.4)))
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await c.rest()
    assert err.value.code() is grpc.StatusCode.INTERNAL and "engine exploded" in (err.value.details() or "")


async def test_idle_timeout_and_time_limit_close_with_a_reason(make_duplex_stack: MakeStack) -> None:
    # Each timer on a stack of its own, the other far out of reach: a loaded box that delays a timer or an
    # append cannot make one close pass for the other.
    stack = await make_duplex_stack(
        overrides=["gateway.duplex_idle_timeout_s=0.3", "gateway.duplex_max_session_s=30"]
    )
    codec: FakeDuplexCodec = stack.codec  # type: ignore[assignment]
    idle = Caller(stack)
    await idle.next("session_created")
    idle.send(append(tone(0.08)))
    replies = await idle.rest(within=3)
    assert await idle.call.code() is grpc.StatusCode.OK
    errors = [r.error for r in replies if r.HasField("error")]
    assert [e.code for e in errors] == ["session_idle_timeout"] and "duplex_idle_timeout_s" in errors[
        0
    ].message
    done = replies[-1].response_done.response
    assert (
        done.status == speech_pb2.RESPONSE_STATUS_INCOMPLETE and done.status_reason == "session_idle_timeout"
    )
    assert codec.end_of_inputs == 1  # closed cleanly on the codec stream

    # The busy session appends every 80 ms for longer than the idle timeout: appends keep it from idling
    # (with room for a loaded box's stalls), and only the limit ends it.
    stack = await make_duplex_stack(
        overrides=["gateway.duplex_idle_timeout_s=0.8", "gateway.duplex_max_session_s=2.0"]
    )
    busy = Caller(stack)
    await busy.next("session_created")
    start = time.monotonic()
    replies: list[speech_pb2.ConverseResponse] = []

    async def read() -> None:
        while (reply := await busy.call.read()) is not grpc.aio.EOF:
            replies.append(reply)

    reader = asyncio.create_task(read())
    while not any(r.HasField("response_done") for r in replies):  # keeps talking: only the limit ends it
        busy.send(append(tone(0.08)))
        await asyncio.sleep(0.08)
        assert time.monotonic() - start < 4
    busy.send(None)  # half-close on response.done, as the SDK does: the call ends with its own status
    await asyncio.wait_for(reader, 3)
    assert await busy.call.code() is grpc.StatusCode.OK
    codes = {r.error.code for r in replies if r.HasField("error")}
    assert "session_expired" in codes and codes <= {"session_expired", "session_closing"}
    assert 1.9 < time.monotonic() - start < 3.5


async def test_input_beyond_the_buffer_is_dropped_and_counted(make_duplex_stack: MakeStack) -> None:
    stack = await make_duplex_stack()
    before = metrics.DUPLEX_DROPPED_INPUT._value.get()
    c = Caller(stack)
    await c.next("session_created")
    c.send(append(tone(4.0)))  # 4 s at once: 2 s wait beyond the codec's grant at most
    notice = (await c.next("error")).error
    assert notice.code == "input_audio_dropped"
    assert metrics.DUPLEX_DROPPED_INPUT._value.get() - before == pytest.approx(2.0)
    c.call.cancel()


async def test_turn_mode_refuses_converse_and_duplex_only_models_refuse_tts(
    make_stack: MakeStack, make_duplex_stack: MakeStack
) -> None:
    turn = await make_stack()
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await Caller(turn).next()
    assert err.value.code() is grpc.StatusCode.FAILED_PRECONDITION
    assert "session_mode: duplex" in (err.value.details() or "")

    duplex = await make_duplex_stack()
    request = speech_pb2.SynthesizeRequest(config=speech_pb2.SynthesisConfig(encoding=PCM), text="hello")
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await duplex.stub.Synthesize(request)
    assert err.value.code() is grpc.StatusCode.FAILED_PRECONDITION and "Converse" in (
        err.value.details() or ""
    )
    import httpx

    async with httpx.AsyncClient(base_url=duplex.http_url) as http:
        r = await http.post("/v1/audio/speech", json={"input": "hello", "model": "personaplex-tiny"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "tts_not_supported"


async def test_stored_voices_are_listed_and_checked(make_duplex_stack: MakeStack) -> None:
    stack = await make_duplex_stack(talker=FakeDuplexTalker(catalog=stored_voices("NATF0", "NATM1")))
    listed = await stack.stub.ListVoices(speech_pb2.ListVoicesRequest())
    assert [v.name for v in listed.voices] == ["NATF0", "NATM1"]
    c = Caller(stack)
    await c.next("session_created")
    out = speech_pb2.SessionAudioOutput(voice="nobody")
    c.send(update("v1", audio=speech_pb2.SessionAudio(output=out)))
    error = (await c.next("error")).error
    assert (error.code, error.param) == ("voice_not_found", "session_update.session.audio.output.voice")
    assert "NATF0, NATM1" in error.message
    c.send(update("v2", audio=speech_pb2.SessionAudio(output=speech_pb2.SessionAudioOutput(voice="natm1"))))
    assert (await c.next("session_updated")).session_updated.session.audio.output.voice == "NATM1"
    c.call.cancel()


async def test_a_session_keeps_one_codec_and_one_talker(make_duplex_stack: MakeStack) -> None:
    # Two codecs and two talkers: two overlapping sessions are spread over them, and every frame of a
    # session goes to the codec stream it opened, naming the talker it opened with (issue 17, sticky).
    stack = await make_duplex_stack(FakeDuplexCodec(), FakeDuplexCodec(), talkers=2)
    codecs: list[FakeDuplexCodec] = [d.servicer for d in stack.codecs]
    frames = 12
    callers = [Caller(stack), Caller(stack)]
    for c in callers:
        await c.next("session_created")
        c.send(append(tone(0.08)))
        await c.next("response_output_audio_delta")  # open now: the second session sees the first's load
    data = tone(0.08 * (frames - 1))
    for off in range(0, len(data), FRAME_BYTES):  # the rest, interleaved between the two sessions
        for c in callers:
            c.send(append(data[off : off + FRAME_BYTES]))
    for c in callers:
        c.send(None)
        assert (await c.rest())[-1].HasField("response_done")
    assert [len(codec.opens) for codec in codecs] == [1, 1]
    assert {codec.opens[0].talker_address for codec in codecs} == {t.address for t in stack.talkers}
    # Each codec saw one session (one request id) and all of its frames.
    for codec in codecs:
        assert list(codec.last_user_audio) == [codec.opens[0].request_id]
    assert [codec.user_messages for codec in codecs] == [frames, frames]
    assert all(codec.protocol_errors == [] for codec in codecs)


def join_count(phase: str) -> float:
    value = metrics.REGISTRY.get_sample_value("voxstage_duplex_join_seconds_count", {"phase": phase})
    return value or 0.0
