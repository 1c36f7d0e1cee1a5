"""The voice library end to end (issue 30), on the session's real stacks of all three families (CPU, tiny
presets; tests/integration/conftest.py gives each gateway a voice store).

Upload through the official ``openai`` client's raw request (it has no voices helper), list, speak by name on
HTTP, gRPC and ``/v1/realtime`` / ``Converse``, delete, and speak again (404 / NOT_FOUND). A second stack
(talker, codec and gateway processes of its own) over the same store sees the first one's uploads, and
after a restart of all its processes still speaks the voice; concurrent uploads of one name to the two
gateways end with one 201 and one 409. A request by an uploaded voice gives the
same PCM, bit for bit, as the same seeded request with the sample inline, also once the codec starts it from
the voice's kept decoder state (services/codec/voice_states.py). Bad input is refused naming its
field with the store's files unchanged.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import io
import threading
from collections.abc import Iterator
from typing import Any

import grpc
import httpx
import numpy as np
import openai
import pytest
import soundfile as sf

from tests.integration.servekit import BASE_FRAMES, Served, serve_stack
from tests.integration.stagekit import reference_clip
from voxstage.v1 import speech_pb2, speech_pb2_grpc

REF_TEXT = "The quick brown fox jumps over the lazy dog."
TEXT = "Hello there, my friend."
FRAME_BYTES = 2 * 1920  # one 80 ms frame of 24 kHz s16le


def wav(seconds: float = 2.0, rate: int = 16000) -> bytes:
    clip = reference_clip(seconds, rate)
    buf = io.BytesIO()
    sf.write(buf, clip.pcm, rate, format="WAV", subtype="PCM_16")
    return buf.getvalue()


def openai_client(served: Served | str) -> openai.OpenAI:
    url = served if isinstance(served, str) else served.http_url
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)


def upload(url: Served | str, name: str, audio: bytes | None, **fields: str) -> httpx.Response:
    """POST /v1/audio/voices through the openai client's raw request (multipart form)."""
    files: dict[str, Any] = {}
    if audio is not None:
        files["audio"] = ("sample.wav", audio, "audio/wav")
    try:
        return openai_client(url).post(
            "/audio/voices",
            cast_to=httpx.Response,
            body={"name": name, **fields},
            files=files,
            options={"headers": {"Content-Type": "multipart/form-data"}},
        )
    except openai.APIStatusError as exc:
        return exc.response


def speak_http(served: Served | str, model: str, voice: str, **extra: Any) -> httpx.Response:
    body = {"model": model, "input": TEXT, "voice": voice, "response_format": "pcm", "seed": 11, **extra}
    url = served if isinstance(served, str) else served.http_url
    return httpx.post(f"{url}/v1/audio/speech", json=body, timeout=120)


def speak_grpc(served: Served, voice: str) -> tuple[grpc.StatusCode, bytes, str]:
    async def main() -> tuple[grpc.StatusCode, bytes, str]:
        async with grpc.aio.insecure_channel(served.grpc_addr) as channel:
            stub = speech_pb2_grpc.SpeechStub(channel)
            config = speech_pb2.SynthesisConfig(
                voice=voice, encoding=speech_pb2.AUDIO_ENCODING_PCM_S16LE, seed=11
            )
            try:
                reply = await stub.Synthesize(
                    speech_pb2.SynthesizeRequest(config=config, text=TEXT), timeout=120
                )
            except grpc.aio.AioRpcError as exc:
                return exc.code(), b"", exc.details() or ""
            return grpc.StatusCode.OK, reply.audio, ""

    return asyncio.run(main())


def list_grpc(served: Served | str) -> list[speech_pb2.Voice]:
    addr = served if isinstance(served, str) else served.grpc_addr

    async def main() -> list[speech_pb2.Voice]:
        async with grpc.aio.insecure_channel(addr) as channel:
            reply = await speech_pb2_grpc.SpeechStub(channel).ListVoices(speech_pb2.ListVoicesRequest())
            return list(reply.voices)

    return asyncio.run(main())


def store_files(served: Served) -> list[tuple[str, int]]:
    assert served.voice_store is not None
    return sorted((str(p.relative_to(served.voice_store)), p.stat().st_size)
                  for p in served.voice_store.rglob("*") if p.is_file())  # fmt: skip


@pytest.fixture
def cleanup(request: pytest.FixtureRequest) -> Iterator[list[tuple[str, str]]]:
    """(http url, voice id) pairs to delete at the end, so the shared stacks' libraries end empty."""
    made: list[tuple[str, str]] = []
    yield made
    for url, voice in made:
        httpx.delete(f"{url}/v1/audio/voices/{voice}", timeout=30)


# -- lifecycle on every family ----------------------------------------------------------------------------


@pytest.mark.parametrize("family", ["qwen_base_served", "audio8_served"])
def test_upload_list_speak_delete_on_tts_families(
    family: str, request: pytest.FixtureRequest, cleanup: list[tuple[str, str]]
) -> None:
    served: Served = request.getfixturevalue(family)
    r = upload(served, "narrator one", wav(), ref_text=REF_TEXT, description="for the test")
    assert r.status_code == 201, r.text
    voice = r.json()
    cleanup.append((served.http_url, voice["id"]))
    assert voice["uploaded"] and voice["id"].startswith("voice_") and voice["model"] == served.model
    listed = httpx.get(f"{served.http_url}/v1/audio/voices").json()["voices"]
    assert [v["id"] for v in listed if v["uploaded"]] == [voice["id"]]
    assert [v.id for v in list_grpc(served) if v.uploaded] == [voice["id"]]
    assert httpx.get(f"{served.http_url}/v1/audio/voices/narrator one").json()["id"] == voice["id"]

    by_name = speak_http(served, served.model, "narrator one")
    assert by_name.status_code == 200 and len(by_name.content) > 0, by_name.text
    by_id = speak_http(served, served.model, voice["id"])
    assert by_id.content == by_name.content  # seeded: the same voice by id or name
    code, audio, _ = speak_grpc(served, "narrator one")
    assert code == grpc.StatusCode.OK and audio == by_name.content

    gone = httpx.delete(f"{served.http_url}/v1/audio/voices/{voice['id']}")
    assert gone.status_code == 200 and gone.json()["deleted"], gone.text
    again = speak_http(served, served.model, "narrator one")
    assert again.status_code == 404 and again.json()["error"]["param"] == "voice", again.text
    code, _, details = speak_grpc(served, "narrator one")
    assert code == grpc.StatusCode.NOT_FOUND and "narrator one" in details
    assert httpx.get(f"{served.http_url}/v1/audio/voices/{voice['id']}").status_code == 404


@pytest.mark.parametrize("family", ["qwen_base_served", "audio8_served"])
def test_an_uploaded_voice_speaks_bit_identically_to_the_same_sample_inline(
    family: str, request: pytest.FixtureRequest, cleanup: list[tuple[str, str]]
) -> None:
    served: Served = request.getfixturevalue(family)
    sample = wav(1.5, 22050)
    r = upload(served, "twin", sample, ref_text=REF_TEXT)
    assert r.status_code == 201, r.text
    cleanup.append((served.http_url, r.json()["id"]))
    by_voice = speak_http(served, served.model, "twin")  # the codec decodes the prefix, keeps the state
    from_state = speak_http(served, served.model, "twin")  # the codec starts from that state
    inline = speak_http(
        served, served.model, "", ref_audio=base64.b64encode(sample).decode(), ref_text=REF_TEXT
    )
    assert by_voice.status_code == from_state.status_code == inline.status_code == 200, inline.text
    assert len(by_voice.content) > 0 and by_voice.content == from_state.content == inline.content


def test_personaplex_speaks_an_uploaded_voice_on_realtime_and_converse(
    personaplex_served: Served, cleanup: list[tuple[str, str]]
) -> None:
    served = personaplex_served
    refused = upload(served, "guest", wav(), ref_text=REF_TEXT)  # a voice recording takes no transcript
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "ref_text", refused.text
    r = upload(served, "guest", wav())
    assert r.status_code == 201, r.text
    cleanup.append((served.http_url, r.json()["id"]))
    assert "guest" in [v.name for v in list_grpc(served) if v.uploaded]

    async def realtime(voice: str) -> tuple[int, list[str]]:
        frames, errors = 0, []
        client = openai.AsyncOpenAI(base_url=f"{served.http_url}/v1", api_key="unused")
        async with client.realtime.connect(model=served.model) as conn:
            await conn.session.update(session={"type": "realtime", "audio": {"output": {"voice": voice}}})
            silence = base64.b64encode(bytes(FRAME_BYTES)).decode()
            async with asyncio.timeout(30):
                async for event in conn:
                    if event.type == "session.updated":
                        for _ in range(15):
                            await conn.input_audio_buffer.append(audio=silence)
                    elif event.type == "response.output_audio.delta":
                        frames += len(base64.b64decode(event.delta)) // FRAME_BYTES
                    elif event.type == "error":
                        errors.append(f"{event.error.param}: {event.error.message}")
                        break
                    if frames >= 5:
                        break
        return frames, errors

    async def converse(voice: str) -> int:
        from voxstage.client import AgentAudio, AsyncSpeechClient

        frames = 0
        async with AsyncSpeechClient(served.grpc_addr) as client:
            async with client.converse(voice=voice, seed=3) as session:
                for _ in range(15):
                    await session.send_audio(bytes(FRAME_BYTES))
                async with asyncio.timeout(30):
                    async for event in session:
                        if isinstance(event, AgentAudio):
                            frames += len(event.data) // FRAME_BYTES
                        if frames >= 5:
                            break
        return frames

    frames, errors = asyncio.run(realtime("guest"))
    assert frames >= 5 and not errors, errors
    assert asyncio.run(converse("guest")) >= 5

    assert httpx.delete(f"{served.http_url}/v1/audio/voices/guest").status_code == 200
    frames, errors = asyncio.run(realtime("guest"))
    assert errors and "voice" in errors[0] and "guest" in errors[0], errors
    from voxstage.client import SpeechError

    with pytest.raises(SpeechError) as err:
        asyncio.run(converse("guest"))
    assert err.value.code == grpc.StatusCode.NOT_FOUND


# -- two stacks over one store ----------------------------------------------------------------------------

SECOND_SETS = [f"stages.0.default_sampling_params.max_tokens={BASE_FRAMES}"]  # as qwen_base_served's


@contextlib.contextmanager
def second_stack(served: Served, factory: pytest.TempPathFactory) -> Iterator[Served]:
    """Another whole stack (talker, codec and gateway processes of its own) over the same voice store."""
    assert served.deploy is not None and served.voice_store is not None
    stack = serve_stack(factory, "second", served.deploy, served.model, SECOND_SETS, cache=served.cache,
                        store=served.voice_store)  # fmt: skip
    with contextlib.closing(stack):
        yield next(stack)
        with contextlib.suppress(StopIteration):
            next(stack)  # its SIGTERM and clean exit, asserted by serve_stack


def test_two_stacks_share_one_store_survive_a_restart_and_race_for_a_name(
    qwen_base_served: Served, tmp_path_factory: pytest.TempPathFactory, cleanup: list[tuple[str, str]]
) -> None:
    served = qwen_base_served
    with second_stack(served, tmp_path_factory) as second:
        r = upload(second.http_url, "shared", wav(), ref_text=REF_TEXT)
        assert r.status_code == 201, r.text
        cleanup.append((served.http_url, r.json()["id"]))
        assert "shared" in [
            v["name"] for v in httpx.get(f"{served.http_url}/v1/audio/voices").json()["voices"]
        ]
        first = speak_http(served, served.model, "shared")
        assert first.status_code == 200, first.text

    # The second stack restarted: new talker, codec and gateway processes; only the store carries the voice.
    with second_stack(served, tmp_path_factory) as second:
        again = speak_http(second.http_url, served.model, "shared")
        assert again.status_code == 200 and again.content == first.content

        # Both gateways at once, one name: exactly one wins.
        results: list[httpx.Response] = []
        sample = wav(3.0)

        def go(target: str) -> None:
            results.append(upload(target, "contested", sample, ref_text=REF_TEXT))

        threads = [threading.Thread(target=go, args=(t,)) for t in (served.http_url, second.http_url)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert sorted(r.status_code for r in results) == [201, 409], [r.text for r in results]
        winner = next(r for r in results if r.status_code == 201).json()
        cleanup.append((served.http_url, winner["id"]))
        loser = next(r for r in results if r.status_code == 409).json()["error"]
        assert loser["param"] == "name" and "contested" in loser["message"]
        named = [
            v["id"]
            for v in httpx.get(f"{second.http_url}/v1/audio/voices").json()["voices"]
            if v["name"] == "contested"
        ]
        assert named == [winner["id"]]
        assert len(list((served.voice_store / "voices").iterdir())) == 2  # no file of the loser left behind


# -- bad input -------------------------------------------------------------------------------------------


def flac_header_of_an_hour(rate: int = 8000) -> bytes:
    buf = io.BytesIO()
    minute = np.zeros(rate * 60, np.int16)
    with sf.SoundFile(buf, "w", rate, 1, format="FLAC", subtype="PCM_16") as f:
        for _ in range(60):
            f.write(minute)
    return buf.getvalue()


def test_bad_uploads_are_refused_naming_the_field_and_change_nothing(qwen_base_served: Served) -> None:
    served = qwen_base_served
    before = store_files(served)
    sample = wav()
    cases: list[tuple[str, dict[str, Any], int, str]] = [
        ("../escape", {}, 400, "name"),
        ("a/b", {}, 400, "name"),
        ("nul\x00byte", {}, 400, "name"),
        ("x" * 300, {}, 400, "name"),
        ("big", {"audio": b"RIFF" + bytes(10 * 1024 * 1024)}, 400, "audio"),
        ("notaudio", {"audio": b"this is not a wave file at all" * 100}, 400, "audio"),
        ("hour", {"audio": flac_header_of_an_hour()}, 400, "audio"),
        ("no audio", {"audio": None}, 400, "audio"),
    ]
    for name, change, status, param in cases:
        fields = {"ref_text": REF_TEXT, **{k: v for k, v in change.items() if k != "audio"}}
        r = upload(served, name, change.get("audio", sample), **fields)
        assert r.status_code == status, (name[:20], r.status_code, r.text[:300])
        assert r.json()["error"]["param"] == param, (name[:20], r.text[:300])
    too_big = upload(served, "huge", b"RIFF" + bytes(24 * 1024 * 1024), ref_text=REF_TEXT)
    assert too_big.status_code == 413, too_big.text[:300]  # beyond any valid upload: refused unread
    assert store_files(served) == before


def test_built_in_voices_cannot_be_deleted_or_shadowed(audio8_served: Served) -> None:
    """Audio8 has a built-in voice and clones from the sample with its transcript (required)."""
    served = audio8_served
    before = store_files(served)
    r = upload(served, "no transcript", wav(), ref_text="")
    assert r.status_code == 400 and r.json()["error"]["param"] == "ref_text", r.text
    builtin = next(v for v in list_grpc(served) if not v.uploaded).name
    r = httpx.delete(f"{served.http_url}/v1/audio/voices/{builtin}")
    assert r.status_code == 400 and r.json()["error"]["param"] == "id", r.text
    taken = upload(served, builtin, wav(), ref_text=REF_TEXT)
    assert taken.status_code == 409 and taken.json()["error"]["param"] == "name", taken.text
    assert store_files(served) == before
