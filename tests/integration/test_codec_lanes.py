"""The codec's two lanes through real processes (``voxstage serve`` with ``codec_urgent_lane_ms``): the codec
builds the laned engine and says what the key does off a GPU, its warm-up runs to the end, a request gets the
same audio as from a stack with one lane, streamed and whole, and requests served together all get theirs
(services/codec/lanes.py; the engine's own tests: tests/unit/codec/test_engine_lanes.py, and on a GPU
tests/gpu/test_codec_lanes_cuda.py). Together against alone is not compared: the talker's batched step is not
batch-invariant on the CPU, with one lane or two."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from tests.integration.servekit import Served, serve_stack

ROOT = Path(__file__).resolve().parents[2]
FRAMES = 80  # up to 6.4 s of audio: past the ramp (1, 1, 2, 4, 8, 16 frames), so both lanes decode
SPF = 1920
TEXTS = [f"Request number {i} on two lanes." for i in range(4)]
pytestmark = pytest.mark.timeout(300)


def stack(factory: pytest.TempPathFactory, name: str, sets: list[str]) -> Iterator[Served]:
    sets = [*sets, f"stages.0.default_sampling_params.max_tokens={FRAMES}"]
    yield from serve_stack(factory, name, ROOT / "deploy" / "qwen3_tts.yaml", "qwen3-tts-tiny", sets)


@pytest.fixture(scope="module")
def laned(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    yield from stack(tmp_path_factory, "lanes", ["stages.1.codec_urgent_lane_ms=10"])


@pytest.fixture(scope="module")
def one_lane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    yield from stack(tmp_path_factory, "one-lane", [])


def speak(served: Served, i: int) -> np.ndarray:
    from voxstage.client import SpeechClient

    with SpeechClient(served.grpc_addr, timeout=120) as client:
        if i % 2:
            return client.synthesize_streamed(TEXTS[i], encoding="pcm_f32", seed=i).to_numpy()
        return client.synthesize(TEXTS[i], encoding="pcm_f32", seed=i).to_numpy()


def test_a_request_gets_the_audio_of_one_lane(laned: Served, one_lane: Served) -> None:
    sizes = []
    for i in range(len(TEXTS)):
        two, one = speak(laned, i), speak(one_lane, i)
        assert two.size == one.size and one.size % SPF == 0 and one.std() > 0
        np.testing.assert_allclose(two, one, atol=1e-5, rtol=0)
        sizes.append(two.size)
    assert max(sizes) > 41 * SPF  # past the ramp and a steady chunk: the bulk lane decoded too
    assert "the lanes take turns" in laned.tail(200_000)  # off a GPU there is no stream priority
    assert "the lanes take turns" not in one_lane.tail(200_000)


def test_requests_together_on_two_lanes_all_get_their_audio(laned: Served) -> None:
    with ThreadPoolExecutor(8) as pool:
        together = list(pool.map(lambda i: speak(laned, i % len(TEXTS)), range(8)))
    assert all(a.size and a.size % SPF == 0 and a.std() > 0 for a in together)
