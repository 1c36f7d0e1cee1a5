"""CUDA checks of the Audio8 streaming decode: exactness on the device, the engine's CUDA-graph plan
(``GraphedDecode``: capture with every row's length 0 must leave all state untouched, replays must stream
exactly), and bf16 staying close to fp32. Skipped without a GPU."""

from __future__ import annotations

import pytest
import torch

from services.codec.graphs import GraphedDecode
from services.codec.models.audio8_tts.codec import Audio8Codec
from services.codec.models.audio8_tts.config import Audio8CodecConfig
from services.codec.models.audio8_tts.loader import random_init
from services.codec.models.audio8_tts.streaming import Audio8StreamingDecoder
from tests.unit.codec.codec_kit import audio8_codes

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
    pytest.mark.usefixtures("no_tf32"),  # conftest.py
]

TOL = 1e-5
SPF = 2048


def _model(dtype: torch.dtype = torch.float32) -> Audio8Codec:
    return random_init(Audio8CodecConfig.tiny(), seed=0, device="cuda", dtype=dtype)


def _codes(seed: int, frames: int, batch: int = 1) -> torch.Tensor:
    return audio8_codes(seed, frames, batch).cuda()


def test_cuda_stream_equals_offline() -> None:
    model = _model()
    codes = _codes(0, 160, batch=2)
    with torch.inference_mode():
        offline = model(codes)
    dec = Audio8StreamingDecoder(model, max_streams=4)
    slots = torch.tensor([3, 1], device="cuda")
    streamed = torch.cat([dec.decode(codes[..., i : i + 8], slots) for i in range(0, 160, 8)], -1)
    assert (streamed - offline).abs().max().item() <= TOL


def test_graphed_buckets_capture_without_touching_state_and_replay_exactly() -> None:
    model = _model()
    pool = Audio8StreamingDecoder(model, max_streams=8)  # engine max_streams 4, upper half scratch
    graphed = GraphedDecode(pool, num_groups=10, max_batch=4, frame_buckets=(4, 8), device="cuda")
    assert graphed.capture_all() == 6  # batch 1, 2, 4 x frames 4, 8
    assert torch.count_nonzero(pool.pool) == 0 and torch.count_nonzero(pool.positions) == 0

    frames = 64
    codes = _codes(1, frames, batch=2)
    with torch.inference_mode():
        offline = model(codes)
    pieces: list[list[torch.Tensor]] = [[], []]
    done = [0, 0]
    sizes = [8, 3]  # stream 1 sends 3-frame chunks padded to the 4-frame bucket
    while min(done) < frames:
        rows = [s for s in (0, 1) if done[s] < frames]
        t = 8 if 0 in rows else 4
        batch = torch.zeros(2, 10, t, dtype=torch.int64, device="cuda")
        lengths = torch.zeros(2, dtype=torch.int64, device="cuda")
        slots = torch.tensor([0, 1], device="cuda")
        for s in rows:
            n = min(sizes[s], frames - done[s], t)
            batch[s, :, :n] = codes[s, :, done[s] : done[s] + n]
            lengths[s] = n
        wav = graphed(batch, slots, lengths)
        for s in rows:
            n = int(lengths[s])
            pieces[s].append(wav[s, : n * SPF].clone())
            done[s] += n
    for s in (0, 1):
        assert (torch.cat(pieces[s]) - offline[s]).abs().max().item() <= TOL
    assert pool.position(0) == pool.position(1) == frames
    assert torch.count_nonzero(pool.pool[4:]) == 0  # scratch slots: warm-ups and captures were no-ops


def test_bf16_stream_tracks_fp32() -> None:
    full, half = _model(), _model(torch.bfloat16)
    assert half.quantizer.quantizer.quantizers[0].codebook.weight.dtype == torch.float32
    codes = _codes(2, 140)
    with torch.inference_mode():
        reference = full(codes)
    dec = Audio8StreamingDecoder(half, max_streams=1)
    streamed = torch.cat([dec.decode(codes[..., i : i + 7], torch.tensor([0])) for i in range(0, 140, 7)], -1)
    assert streamed.dtype == torch.bfloat16 and torch.isfinite(streamed).all()
    cos = torch.nn.functional.cosine_similarity(streamed.float(), reference, dim=-1).item()
    assert cos > 0.99, f"bf16 streamed: cosine {cos:.4f} to fp32"
