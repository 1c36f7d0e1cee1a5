"""CUDA-graph paths equal the eager paths (tiny preset, fp32). Skipped without a GPU."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from services.codec.graphs import GraphedDecode
from services.codec.models.qwen3_tts.loader import random_init as random_decoder
from services.codec.models.qwen3_tts.presets import decoder_preset
from services.codec.models.qwen3_tts.streaming import StreamingDecoder
from services.talker.engine import TalkerRequest
from services.talker.models import load_talker
from services.talker.sampling import SamplingParams
from services.talker.spec import SpeechSpec
from tests.unit.talker.talker_kit import run_graphed
from voxstage.presets import resolve_model

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
SAMPLED = SamplingParams(do_sample=True, temperature=0.9, top_k=50, repetition_penalty=1.05)


def run_engine(
    graphs: bool, async_scheduling: bool = False, capture_all: bool = False
) -> dict[str, np.ndarray]:
    adapter, _ = load_talker(resolve_model("qwen3-tts-tiny"), device="cuda", dtype=torch.float32)
    reqs = [
        TalkerRequest(
            f"r{i}",
            SpeechSpec(text=f"hello number {i}", voice="ryan"),
            seed=i,
            sampling=SAMPLED,
            subtalker=SAMPLED,
            max_frames=20,
        )  # fmt: skip
        for i in range(6)
    ]
    return run_graphed(adapter, reqs, graphs, async_scheduling, capture_all)


@pytest.mark.parametrize("async_scheduling,capture_all", [(False, False), (True, False), (True, True)])
def test_talker_graph_equals_eager(async_scheduling: bool, capture_all: bool) -> None:
    eager, graph = run_engine(False), run_engine(True, async_scheduling, capture_all)
    assert eager.keys() == graph.keys()
    for k in eager:
        assert np.array_equal(eager[k], graph[k]), k


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("capture_all", [False, True])
def test_codec_graph_equals_eager(capture_all: bool, dtype: torch.dtype) -> None:
    """Graphed decode equals eager with the fused kernels (Snake) on, as served, in both codec precisions."""
    model = random_decoder(decoder_preset("qwen3-tts-tiny"), 0, device="cuda", dtype=dtype)
    eager_pool, graph_pool = StreamingDecoder(model, 8), StreamingDecoder(model, 8)
    graphed = GraphedDecode(graph_pool, num_groups=16, max_batch=3, frame_buckets=(1, 5), device="cuda")
    if capture_all:  # what the codec stage does after its warm-up stream: buckets 1, 2, 3 x frames 1, 5
        assert graphed.batch_buckets() == [1, 2, 3]
        assert graphed.capture_all(max_frames=10) == 5  # (3, 5) = 15 frames stays lazy
        assert graphed.capture_all() == 1
    gen = torch.Generator(device="cuda").manual_seed(0)
    slots = torch.arange(3, device="cuda")
    for t in (1, 5, 5, 1, 5):
        codes = torch.randint(0, 2048, (3, 16, t), device="cuda", generator=gen)
        lengths = torch.full((3,), t, device="cuda")
        a = eager_pool.decode(codes, slots, lengths)
        b = graphed(codes, slots, lengths)
        # Same kernels on the same shapes: equal up to a last-bit difference of a library's algorithm pick.
        atol = 1e-5 if dtype == torch.float32 else 1e-2
        assert torch.allclose(a.float(), b.float(), atol=atol), float((a.float() - b.float()).abs().max())
