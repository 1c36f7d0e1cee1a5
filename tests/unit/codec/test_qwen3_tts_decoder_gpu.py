"""CUDA checks of the 12 Hz decoder's streaming path: exactness on the device, CUDA-graph capture of one
(B, T) bucket (the engine's plan), and half precision staying close to fp32."""

from __future__ import annotations

import pytest
import torch

from services.codec.models.qwen3_tts.decoder import Qwen3TokenizerDecoder
from services.codec.models.qwen3_tts.loader import random_init
from services.codec.models.qwen3_tts.presets import decoder_preset
from services.codec.models.qwen3_tts.streaming import StreamingDecoder
from tests.unit.codec.codec_kit import random_codes

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
    pytest.mark.usefixtures("no_tf32"),  # conftest.py
]

SPF = 1920
TOL = 1e-5


def _model(dtype: torch.dtype = torch.float32) -> Qwen3TokenizerDecoder:
    return random_init(decoder_preset("qwen3-tts-tiny"), seed=0, device="cuda", dtype=dtype)


def _codes(seed: int, frames: int, batch: int = 1) -> torch.Tensor:
    return random_codes(seed, frames, batch).cuda()


def test_cuda_stream_equals_single_pass() -> None:
    model = _model()
    codes = _codes(0, 200, batch=2)
    with torch.inference_mode():
        offline = model(codes)
    dec = StreamingDecoder(model, max_streams=4)
    slots = torch.tensor([3, 1], device="cuda")
    streamed = torch.cat([dec.decode(codes[..., i : i + 5], slots) for i in range(0, 200, 5)], -1)
    assert (streamed - offline).abs().max().item() <= TOL


def test_cuda_graph_bucket_replays_exactly() -> None:
    model = _model()
    b, t, frames = 2, 5, 160
    codes = _codes(1, frames, batch=b)
    with torch.inference_mode():
        offline = model(codes)
    dec = StreamingDecoder(model, max_streams=3)
    static_codes = torch.zeros(b, 16, t, dtype=torch.int64, device="cuda")
    static_slots = torch.tensor([2, 0], device="cuda")
    static_lengths = torch.full((b,), t, dtype=torch.int64, device="cuda")

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):  # warm-up allocations and kernel selection outside the capture
            dec.decode(static_codes, static_slots, static_lengths)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_wav = dec.decode(static_codes, static_slots, static_lengths)
    dec.reset(torch.arange(3, device="cuda"))  # the warm-up advanced the slots

    pieces = []
    for i in range(0, frames, t):
        static_codes.copy_(codes[..., i : i + t])
        graph.replay()
        pieces.append(static_wav.clone())
    replayed = torch.cat(pieces, -1)
    assert dec.position(2) == frames and dec.position(0) == frames and dec.position(1) == 0
    assert (replayed - offline).abs().max().item() <= TOL


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_stream_tracks_fp32(dtype: torch.dtype) -> None:
    full, half = _model(), _model(dtype)
    assert half.quantizer.rvq_first.vq.layers[0]._codebook.embedding_sum.dtype == torch.float32
    codes = _codes(2, 120)
    with torch.inference_mode():
        reference = full(codes)
        offline_half = half(codes)
    dec = StreamingDecoder(half, max_streams=1)
    streamed = torch.cat([dec.decode(codes[..., i : i + 8], torch.tensor([0])) for i in range(0, 120, 8)], -1)
    assert streamed.dtype == dtype and torch.isfinite(streamed).all()
    for name, wav in (("offline", offline_half), ("streamed", streamed)):
        cos = torch.nn.functional.cosine_similarity(wav.float(), reference, dim=-1).item()
        assert cos > 0.99, f"{dtype} {name}: cosine {cos:.4f} to fp32"
