"""Bounded fuzzing of the public gRPC face (issue 15): hypothesis builds ``SynthesisConfig``s with arbitrary
field values (full wire ranges, nan/inf/denormal floats, control characters, unknown enum numbers, random
reference bytes) and request sequences for the bidi stream, and sends them through a real channel to a
gateway in front of stage doubles. Whatever comes back may be any status but INTERNAL or UNKNOWN (those mean
the gateway did not judge the input), and the stack must still serve a normal request afterwards.

Hypothesis drives a sync channel in a worker thread while the gateway runs in the test's event loop; the
runs are derandomized and capped (``max_examples``) so CI is reproducible and takes seconds."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
from gateway_fakes import MODEL
from gateway_kit import SPEAKERS, MakeStack, Stack
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from voxstage.v1 import speech_pb2, speech_pb2_grpc

FORBIDDEN = {grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN}
CALL_TIMEOUT_S = 10.0
PCM = speech_pb2.AUDIO_ENCODING_PCM_S16LE
FUZZ = settings(
    max_examples=400,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

INT32 = st.one_of(st.integers(-(2**31), 2**31 - 1), st.sampled_from([0, 1, -1, 2**31 - 1, -(2**31)]))
UINT32 = st.one_of(st.integers(0, 2**32 - 1), st.sampled_from([0, 1, 2**32 - 1, 24_000, 16_000, 48_000]))
UINT64 = st.one_of(st.integers(0, 2**64 - 1), st.sampled_from([0, 2**64 - 1, 2**63]))
FLOAT = st.one_of(
    st.floats(width=32, allow_nan=True, allow_infinity=True, allow_subnormal=True),
    st.sampled_from([0.0, -0.0, 1.0, 0.5, float("nan"), float("inf"), float("-inf"), 1e-45, 3.4e38]),
)
# Enum values: every declared number plus unknown ones (proto3 enums are open: any int32 goes on the wire).
ENCODING = st.one_of(st.integers(0, 7), st.integers(-(2**31), 2**31 - 1))
TEXT = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=24)
SHORT_TEXT = st.one_of(st.sampled_from(["hi", "hello there", "", " ", "\x00", "a\nb\u200b"]), TEXT)
MODEL_NAME = st.one_of(st.sampled_from(["", MODEL, "tts-1"]), TEXT)
VOICE = st.one_of(st.sampled_from(["", *SPEAKERS]), TEXT)
LANGUAGE = st.one_of(st.sampled_from(["", "english", "chinese", "sichuan_dialect", "auto"]), TEXT)


def _maybe(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(st.none(), strategy)


FIELDS = ["model", "voice", "language", "instructions", "encoding", "sample_rate_hz", "seed", "sampling",
          "subtalker_sampling", "reference_audio", "chunk_schedule"]  # fmt: skip


@st.composite
def configs(draw: Callable[[st.SearchStrategy[Any]], Any]) -> speech_pb2.SynthesisConfig:
    """A config whose fields are all wild (a quarter of the time), or a valid one with one or two wild fields
    (so synthesis is reached with odd values, not only the first check that fails)."""
    wild = set(FIELDS) if draw(st.integers(0, 3)) == 0 else draw(st.sets(st.sampled_from(FIELDS), max_size=2))

    def pick(name: str, strategy: st.SearchStrategy[Any], sane: Any) -> Any:
        return draw(strategy) if name in wild else sane

    c = speech_pb2.SynthesisConfig(
        model=pick("model", MODEL_NAME, ""),
        voice=pick("voice", VOICE, "serena"),
        language=pick("language", LANGUAGE, ""),
        instructions=pick("instructions", TEXT, ""),
        encoding=pick("encoding", ENCODING, PCM),
        sample_rate_hz=pick("sample_rate_hz", UINT32, 0),
        non_streaming_mode=draw(st.booleans()),
    )
    if (seed := pick("seed", _maybe(UINT64), None)) is not None:
        c.seed = seed
    if "sampling" in wild:
        for name, strategy in [
            ("temperature", FLOAT), ("top_k", INT32), ("top_p", FLOAT), ("repetition_penalty", FLOAT),
            ("max_frames", UINT32),
        ]:  # fmt: skip
            if (value := draw(_maybe(strategy))) is not None:
                setattr(c.sampling, name, value)
    if "subtalker_sampling" in wild:
        sub = c.subtalker_sampling
        if (do_sample := draw(_maybe(st.booleans()))) is not None:
            sub.do_sample = do_sample
        for name, strategy in [("temperature", FLOAT), ("top_k", INT32), ("top_p", FLOAT)]:
            if (value := draw(_maybe(strategy))) is not None:
                setattr(sub, name, value)
    if "reference_audio" in wild:
        c.reference_audio.CopyFrom(
            speech_pb2.ReferenceAudio(
                data=draw(st.binary(max_size=256)),
                encoding=draw(ENCODING),
                sample_rate_hz=draw(UINT32),
                text=draw(TEXT),
            )
        )
    if "chunk_schedule" in wild:
        c.chunk_schedule.initial_chunk_frames = draw(UINT32)
        c.chunk_schedule.steady_chunk_frames = draw(UINT32)
    return c


TEXT_ITEM = st.one_of(st.sampled_from(["hello ", "there."]), SHORT_TEXT).map(
    lambda t: speech_pb2.StreamingSynthesizeRequest(text=t)
)
FLUSH_ITEM = st.just(speech_pb2.StreamingSynthesizeRequest(flush=speech_pb2.Flush()))
# Mostly text deltas and flushes; now and then a (second, misplaced) config.
STREAM_ITEM = st.one_of(
    TEXT_ITEM, TEXT_ITEM, FLUSH_ITEM, configs().map(lambda c: speech_pb2.StreamingSynthesizeRequest(config=c))
)


@st.composite
def stream_sequences(draw: Callable[[st.SearchStrategy[Any]], Any]) -> list[Any]:
    """Config first (most of the time, so the gateway gets past its opening check) or not at all / late."""
    seq: list[Any] = []
    if draw(st.integers(0, 3)) > 0:
        seq.append(speech_pb2.StreamingSynthesizeRequest(config=draw(configs())))
    seq.extend(draw(st.lists(STREAM_ITEM, max_size=5)))
    return seq


def _code(fn: Callable[[], Any]) -> grpc.StatusCode:
    try:
        fn()
    except grpc.RpcError as err:
        return err.code()  # type: ignore[no-any-return]
    return grpc.StatusCode.OK


def _check(code: grpc.StatusCode, what: Any, seen: Counter[grpc.StatusCode]) -> None:
    seen[code] += 1
    assert code not in FORBIDDEN, f"{code} for {what!r}"


def _fuzz_unary(addr: str, seen: Counter[grpc.StatusCode]) -> None:
    with grpc.insecure_channel(addr) as channel:
        stub = speech_pb2_grpc.SpeechStub(channel)

        @FUZZ
        @given(config=configs(), text=SHORT_TEXT)
        def synthesize(config: speech_pb2.SynthesisConfig, text: str) -> None:
            request = speech_pb2.SynthesizeRequest(config=config, text=text)
            _check(_code(lambda: stub.Synthesize(request, timeout=CALL_TIMEOUT_S)), request, seen)

        @FUZZ
        @given(model=MODEL_NAME, language=LANGUAGE)
        def list_voices(model: str, language: str) -> None:
            request = speech_pb2.ListVoicesRequest(model=model, language=language)
            _check(_code(lambda: stub.ListVoices(request, timeout=CALL_TIMEOUT_S)), request, seen)

        synthesize()
        list_voices()


VOICE_NAME = st.one_of(
    st.sampled_from(["narrator", "../x", "a/b", "nul\x00", "x" * 300, "serena", "voice_" + "0" * 24, ""]),
    TEXT,
)
AUDIO_BYTES = st.one_of(st.binary(max_size=64), st.sampled_from([b"", b"RIFF", b"fLaC" + bytes(40)]))


def _fuzz_voices(addr: str, seen: Counter[grpc.StatusCode]) -> None:
    """The voice library's RPCs (issue 30): names, files and fields of any shape."""
    with grpc.insecure_channel(addr) as channel:
        stub = speech_pb2_grpc.SpeechStub(channel)

        @FUZZ
        @given(name=VOICE_NAME, audio=AUDIO_BYTES, text=SHORT_TEXT, model=MODEL_NAME, language=LANGUAGE,
               description=TEXT, consent=_maybe(AUDIO_BYTES))  # fmt: skip
        def create(name: str, audio: bytes, text: str, model: str, language: str, description: str,
                   consent: bytes | None) -> None:  # fmt: skip
            request = speech_pb2.CreateVoiceRequest(
                name=name, audio=audio, ref_text=text, model=model, language=language,
                description=description, consent_audio=consent or b"",
            )  # fmt: skip
            _check(_code(lambda: stub.CreateVoice(request, timeout=CALL_TIMEOUT_S)), request, seen)

        @FUZZ
        @given(ref=VOICE_NAME, delete=st.booleans())
        def get_or_delete(ref: str, delete: bool) -> None:
            def call() -> Any:
                if delete:
                    return stub.DeleteVoice(speech_pb2.DeleteVoiceRequest(id=ref), timeout=CALL_TIMEOUT_S)
                return stub.GetVoice(speech_pb2.GetVoiceRequest(id=ref), timeout=CALL_TIMEOUT_S)

            _check(_code(call), ref, seen)

        create()
        get_or_delete()


def _fuzz_stream(addr: str, seen: Counter[grpc.StatusCode]) -> None:
    with grpc.insecure_channel(addr) as channel:
        stub = speech_pb2_grpc.SpeechStub(channel)

        @FUZZ
        @given(seq=stream_sequences())
        def streaming(seq: list[Any]) -> None:
            def drain() -> None:
                for _ in stub.StreamingSynthesize(iter(seq), timeout=CALL_TIMEOUT_S):
                    pass

            _check(_code(drain), seq, seen)

        streaming()


async def _assert_healthy(stack: Stack) -> None:
    config = speech_pb2.SynthesisConfig(voice="serena", encoding=PCM)
    reply = await stack.stub.Synthesize(speech_pb2.SynthesizeRequest(config=config, text="hello"))
    assert reply.audio

    def requests() -> Iterator[speech_pb2.StreamingSynthesizeRequest]:
        yield speech_pb2.StreamingSynthesizeRequest(config=config)
        yield speech_pb2.StreamingSynthesizeRequest(text="hello there")

    kinds = [r.WhichOneof("response") async for r in stack.stub.StreamingSynthesize(requests())]
    assert kinds[0] == "started" and kinds[-1] == "summary"
    async with httpx.AsyncClient(base_url=stack.http_url) as client:
        assert (await client.get("/health")).status_code == 200


async def test_fuzz_unary_and_list_voices(make_stack: MakeStack) -> None:
    stack = await make_stack()
    await _assert_healthy(stack)
    seen: Counter[grpc.StatusCode] = Counter()
    await asyncio.to_thread(_fuzz_unary, stack.grpc_addr, seen)
    print(dict(seen))
    # The generator reaches both the gateway's checks and real synthesis, not only one of them.
    assert seen[grpc.StatusCode.OK] and seen[grpc.StatusCode.INVALID_ARGUMENT], seen
    await _assert_healthy(stack)


async def test_fuzz_voice_library(make_stack: MakeStack, tmp_path: Path) -> None:
    stack = await make_stack(overrides=[f"gateway.voice_store_dir={tmp_path}"])
    await _assert_healthy(stack)
    seen: Counter[grpc.StatusCode] = Counter()
    await asyncio.to_thread(_fuzz_voices, stack.grpc_addr, seen)
    print(dict(seen))
    assert seen[grpc.StatusCode.INVALID_ARGUMENT] and seen[grpc.StatusCode.NOT_FOUND], seen
    stored = await asyncio.to_thread(lambda: sorted(p.name for p in tmp_path.rglob("*")))
    assert stored == ["names", "tmp", "voices"]  # nothing was stored
    await _assert_healthy(stack)


async def test_fuzz_streaming_sequences(make_stack: MakeStack) -> None:
    stack = await make_stack()
    await _assert_healthy(stack)
    seen: Counter[grpc.StatusCode] = Counter()
    await asyncio.to_thread(_fuzz_stream, stack.grpc_addr, seen)
    print(dict(seen))
    assert seen[grpc.StatusCode.OK] and seen[grpc.StatusCode.INVALID_ARGUMENT], seen
    await _assert_healthy(stack)
