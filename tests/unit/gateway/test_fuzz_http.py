"""Bounded fuzzing of the HTTP face (issue 15): schemathesis generates requests from the checked-in OpenAPI
schema (docs/openapi.json, written by scripts/gen_openapi.py from the FastAPI app) — valid and invalid
ones — and sends them to a live gateway in front of stage doubles. No response may be a 5xx, and the stack
must still serve a normal request afterwards. The runs are derandomized and capped so CI is reproducible."""

from __future__ import annotations

import asyncio
import base64
import importlib.util
import json
from collections import Counter
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import schemathesis
from gateway_kit import REPO, MakeStack, Stack
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode

from voxstage.v1 import speech_pb2

OPENAPI = REPO / "docs" / "openapi.json"
CALL_TIMEOUT_S = 10.0
FUZZ = settings(
    max_examples=150,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=list(HealthCheck),
)


def _gen_openapi() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_openapi", REPO / "scripts" / "gen_openapi.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_openapi_is_current() -> None:
    assert OPENAPI.read_text(encoding="utf-8") == _gen_openapi().render(), (
        "docs/openapi.json is stale: run scripts/gen_openapi.py"
    )


def test_openapi_declares_speech_body() -> None:
    body = json.loads(OPENAPI.read_text(encoding="utf-8"))["paths"]["/v1/audio/speech"]["post"]["requestBody"]
    assert body["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/SpeechRequest"}


def _fuzz(base_url: str) -> Counter[tuple[str, int]]:
    schema = schemathesis.openapi.from_path(OPENAPI)
    seen: Counter[tuple[str, int]] = Counter()
    for result in schema.get_all_operations():
        operation = result.ok()
        # Invalid data needs something to be invalid: operations without parameters or body get none.
        modes = [GenerationMode.POSITIVE] + [GenerationMode.NEGATIVE] * bool(
            len(operation.query) or operation.body
        )
        for mode in modes:

            @FUZZ
            @given(case=operation.as_strategy(generation_mode=mode))
            def run(case: schemathesis.Case) -> None:
                response = case.call(base_url=base_url, timeout=CALL_TIMEOUT_S)
                seen[(case.path, response.status_code)] += 1
                assert response.status_code < 500, (
                    f"{case.method} {case.path} {case.body!r} query={case.query!r} -> "
                    f"{response.status_code} {response.content[:500]!r}"
                )

            run()
    return seen


INT = st.one_of(st.integers(), st.sampled_from([0, -1, 2**31, 2**32, 2**63, 2**64, -(2**63), 10**30]))
FLOAT = st.one_of(
    st.floats(allow_subnormal=True), st.sampled_from([float("nan"), float("inf"), 5e-324, 1e308])
)
TEXT = st.text(max_size=24)
JUNK = st.one_of(st.none(), st.booleans(), INT, FLOAT, TEXT, st.lists(INT, max_size=2))
# Extreme values the schema's positive cases rarely reach: NaN/Infinity tokens (Python's json writes them),
# out-of-range integers, garbage base64 and audio, and now and then a field of the wrong type.
SPEECH_BODY = st.fixed_dictionaries(
    {"input": st.one_of(st.sampled_from(["hello", "hi there"]), TEXT)},
    optional={
        "voice": st.one_of(st.sampled_from(["serena", "ryan"]), TEXT, st.fixed_dictionaries({"id": TEXT})),
        "model": st.one_of(st.just("qwen3-tts-tiny"), TEXT),
        "language": st.one_of(st.just("english"), TEXT),
        "response_format": st.one_of(
            st.sampled_from(["pcm", "wav", "mp3", "opus", "mulaw", "pcm_f32"]), TEXT
        ),
        "stream": st.one_of(st.booleans(), st.none()),
        "stream_format": st.sampled_from(["audio", "sse", None, "x"]),
        "speed": FLOAT,
        "sample_rate": INT,
        "seed": INT,
        "temperature": FLOAT,
        "top_k": INT,
        "top_p": FLOAT,
        "repetition_penalty": FLOAT,
        "max_frames": INT,
        "ref_audio": st.one_of(TEXT, st.binary(max_size=64).map(lambda b: base64.b64encode(b).decode())),
        "ref_text": TEXT,
        "bogus": JUNK,
    },
).flatmap(
    lambda body: st.one_of(
        st.just(body),
        st.sampled_from(sorted(body)).flatmap(lambda key: JUNK.map(lambda v: {**body, key: v})),
    )
)


def _fuzz_speech_bodies(base_url: str) -> Counter[int]:
    seen: Counter[int] = Counter()
    with httpx.Client(base_url=base_url, timeout=CALL_TIMEOUT_S) as client:

        @FUZZ
        @given(body=SPEECH_BODY)
        def run(body: dict[str, Any]) -> None:
            data = json.dumps(body)  # allow_nan: NaN and Infinity go out as the tokens Python writes
            response = client.post(
                "/v1/audio/speech", content=data, headers={"content-type": "application/json"}
            )
            seen[response.status_code] += 1
            assert response.status_code < 500, f"{data} -> {response.status_code} {response.content[:500]!r}"

        run()
    return seen


async def _assert_healthy(stack: Stack) -> None:
    config = speech_pb2.SynthesisConfig(voice="serena", encoding=speech_pb2.AUDIO_ENCODING_PCM_S16LE)
    reply = await stack.stub.Synthesize(speech_pb2.SynthesizeRequest(config=config, text="hello"))
    assert reply.audio
    async with httpx.AsyncClient(base_url=stack.http_url, timeout=CALL_TIMEOUT_S) as client:
        assert (await client.get("/health")).status_code == 200
        speech = await client.post(
            "/v1/audio/speech", json={"input": "hello", "voice": "serena", "response_format": "wav"}
        )
        assert speech.status_code == 200 and speech.content[:4] == b"RIFF"


async def test_fuzz_http_face(make_stack: MakeStack, tmp_path: Path) -> None:
    # With a voice library (issue 30), so that /v1/audio/voices reaches its checks and the store.
    stack = await make_stack(overrides=[f"gateway.voice_store_dir={tmp_path}"])
    await _assert_healthy(stack)
    seen = await asyncio.to_thread(_fuzz, stack.http_url)
    print(dict(seen))
    # The generator reaches synthesis as well as the request checks.
    assert seen[("/v1/audio/speech", 200)] and any(
        path == "/v1/audio/speech" and 400 <= code < 500 for path, code in seen
    ), seen
    assert seen[("/v1/audio/voices", 400)], seen
    await _assert_healthy(stack)


async def test_fuzz_speech_extreme_bodies(make_stack: MakeStack) -> None:
    stack = await make_stack()
    await _assert_healthy(stack)
    seen = await asyncio.to_thread(_fuzz_speech_bodies, stack.http_url)
    print(dict(seen))
    assert seen[200] and seen[400], seen
    await _assert_healthy(stack)
