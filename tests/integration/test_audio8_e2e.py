"""Audio8-TTS end to end: ``voxstage serve deploy/audio8_tts.yaml --model audio8-tts-tiny`` (the seed file,
unchanged) as three processes, called as a user would: the official ``openai`` client over HTTP and the SDK
over gRPC, plain text-to-speech and voice clone, 44.1 kHz audio natively and resampled on request.
"""

from __future__ import annotations

import base64
import io
import wave

import grpc
import httpx
import numpy as np
import pytest
import soundfile as sf

from tests.integration.servekit import AUDIO8_FRAMES, Served

pytestmark = pytest.mark.timeout(300)

MODEL = "audio8-tts-tiny"
RATE, SPF = 44_100, 2048
FRAMES = AUDIO8_FRAMES  # every request is capped here (the deploy's max_tokens)


def reference_wav(seconds: float = 1.0, rate: int = 24_000) -> bytes:
    t = np.arange(int(seconds * rate)) / rate
    buf = io.BytesIO()
    sf.write(buf, (0.3 * np.sin(2 * np.pi * 180 * t)).astype(np.float32), rate, format="WAV")
    return buf.getvalue()


@pytest.fixture(scope="module")
def served(audio8_served: Served) -> Served:
    return audio8_served  # the session's Audio8 stack (tests/integration/conftest.py), shared with test_chaos


def test_openai_client_plain_and_clone(served: Served) -> None:
    from openai import OpenAI

    client = OpenAI(base_url=f"{served.http_url}/v1", api_key="unused", max_retries=0)
    reply = client.audio.speech.create(
        model=MODEL, voice="default", input="Hello from Audio8.", response_format="wav"
    )
    # The endpoint streams by default (as OpenAI's does), so the header declares an open length; it carries
    # the native rate, and the data is FRAMES codec frames of 2048 samples each.
    with wave.open(io.BytesIO(reply.content)) as w:
        assert w.getframerate() == RATE and w.getnchannels() == 1
        frames = len(w.readframes(1 << 30)) // 2
    assert frames == FRAMES * SPF
    pcm, _ = sf.read(io.BytesIO(reply.content))
    assert np.abs(pcm).max() > 1e-3
    clone = client.audio.speech.create(
        model=MODEL, voice="default", input="Now in a cloned voice.", response_format="wav",
        extra_body={"ref_audio": base64.b64encode(reference_wav()).decode(), "ref_text": "A reference."},
    )  # fmt: skip
    data, rate = sf.read(io.BytesIO(clone.content))
    assert rate == RATE and len(data) == FRAMES * SPF


def test_http_resampling_and_clear_errors(served: Served) -> None:
    with httpx.Client(base_url=served.http_url, timeout=120) as http:
        wav = http.post(
            "/v1/audio/speech", json={"input": "Resampled.", "response_format": "wav", "sample_rate": 24000}
        )
        data, rate = sf.read(io.BytesIO(wav.content))
        assert wav.status_code == 200 and rate == 24_000
        assert abs(len(data) - FRAMES * SPF * 24_000 / RATE) <= 2
        no_text = http.post(
            "/v1/audio/speech",
            json={"input": "x", "ref_audio": base64.b64encode(reference_wav()).decode()},
        )
        assert no_text.status_code == 400 and "ref_text" in no_text.json()["error"]["message"]
        styled = http.post("/v1/audio/speech", json={"input": "x", "instructions": "Whisper."})
        assert styled.status_code == 400 and "instructions" in styled.json()["error"]["message"]
        voices = http.get("/v1/audio/voices").json()
        assert [v["name"] for v in voices["voices"]] == ["default"]
        assert voices["voices"][0]["native_sample_rate_hz"] == RATE


def test_sdk_grpc_plain_streaming_and_clone(served: Served) -> None:
    from voxstage.client import SpeechClient, SpeechError

    with SpeechClient(served.grpc_addr, timeout=120) as client:
        audio = client.synthesize("Over gRPC.", encoding="pcm_f32", seed=7)
        assert audio.sample_rate == RATE and audio.to_numpy().size == FRAMES * SPF
        again = client.synthesize("Over gRPC.", encoding="pcm_f32", seed=7)
        np.testing.assert_array_equal(again.to_numpy(), audio.to_numpy())  # seeded: repeatable
        streamed = client.synthesize_streamed("Streamed.", encoding="pcm", seed=1)
        assert streamed.sample_rate == RATE and streamed.to_numpy().size == FRAMES * SPF
        cloned = client.synthesize(
            "Cloned over gRPC.", encoding="wav", seed=7,
            reference_audio=reference_wav(), reference_text="A reference.",
        )  # fmt: skip
        assert cloned.sample_rate == RATE and cloned.to_numpy().size == FRAMES * SPF
        with pytest.raises(SpeechError) as err:
            client.synthesize("x", voice="ryan")
        assert err.value.code is grpc.StatusCode.NOT_FOUND and "voice" in err.value.message
