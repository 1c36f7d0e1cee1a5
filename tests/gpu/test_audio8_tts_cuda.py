"""Audio8-TTS on CUDA: the graphed frame step and prefill equal the eager paths, the Triton glue kernels
equal their PyTorch fallbacks, and the released-size model runs graphed (step times printed). Skipped
without a GPU."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from services.talker.engine import EngineConfig, TalkerEngine, TalkerRequest
from services.talker.models.audio8_tts.adapter import Audio8TTSAdapter
from services.talker.models.audio8_tts.config import Audio8TalkerConfig, parse_config
from services.talker.models.audio8_tts.loader import random_init
from services.talker.models.audio8_tts.model import Audio8TTSModel
from services.talker.models.audio8_tts.presets import preset_config
from services.talker.models.audio8_tts.tokenizer import Audio8Tokenizer
from services.talker.sampling import SamplingParams
from services.talker.spec import SpeechSpec
from tests.unit.talker.talker_kit import run_graphed
from voxstage.nn.fused import set_triton

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
SAMPLED = SamplingParams(temperature=0.7, top_k=50, top_p=0.9)


def tiny(dtype: torch.dtype) -> Audio8TTSModel:
    return random_init(parse_config(preset_config("audio8-tts-tiny")), seed=0, device="cuda", dtype=dtype)


def run_engine(
    model: Audio8TTSModel, graphs: bool, async_scheduling: bool = False, capture_all: bool = False
) -> dict[str, np.ndarray]:
    reqs = [
        TalkerRequest(f"r{i}", SpeechSpec(text=f"hello number {i}"), i, SAMPLED, SAMPLED, max_frames=12 + i)
        for i in range(6)
    ]
    return run_graphed(
        Audio8TTSAdapter(model, Audio8Tokenizer.tiny()), reqs, graphs, async_scheduling, capture_all
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("async_scheduling,capture_all", [(False, False), (True, False), (True, True)])
def test_graphs_equal_eager(dtype: torch.dtype, async_scheduling: bool, capture_all: bool) -> None:
    model = tiny(dtype)
    eager, graph = run_engine(model, False), run_engine(model, True, async_scheduling, capture_all)
    assert eager.keys() == graph.keys()
    for k in eager:
        assert eager[k].shape == (12 + int(k[1:]), 10) and eager[k].max() < 4096
        assert np.array_equal(eager[k], graph[k]), k


def test_triton_glue_matches_torch_fallback() -> None:
    model = tiny(torch.float32)
    c = model.config
    gen = torch.Generator(device="cuda").manual_seed(0)
    ids = torch.randint(0, c.pad_token_id, (1, 40), device="cuda", generator=gen)
    codes = torch.zeros(1, 40, 10, dtype=torch.int64, device="cuda")
    x = model.embed(ids, codes)
    pos = torch.arange(40, device="cuda").unsqueeze(0)
    outs = []
    for enabled in (True, False):
        previous = set_triton(enabled)
        try:
            outs.append(model.slow(x, pos, model.allocate_kv(1, 64), None, 64)[0])
        finally:
            set_triton(previous)
    torch.testing.assert_close(outs[0], outs[1], rtol=1e-5, atol=1e-5)


def test_released_size_runs_graphed_and_step_times() -> None:
    """The 0.6B geometry with random weights in bf16: graphed frame steps per batch bucket, with the time of
    one step printed (run with -s); an Audio8 frame is 46.4 ms of audio."""
    model = random_init(Audio8TalkerConfig(), seed=0, device="cuda", dtype=torch.bfloat16)
    adapter = Audio8TTSAdapter(model, Audio8Tokenizer.tiny())
    adapter.enable_cuda_graphs()
    eng = TalkerEngine(adapter, EngineConfig(max_num_seqs=64, max_model_len=2048, max_num_batched_tokens=512))
    eng.submit(TalkerRequest("warm", SpeechSpec(text="hello there"), 0, SAMPLED, SAMPLED, max_frames=4))
    frames = []
    while eng.has_work():
        frames += [o.codes for o in eng.step() if o.codes.shape[0]]
    assert np.concatenate(frames).shape == (4, 10)
    adapter.state.positions.fill_(300)  # a steady-state context: prompt + a few seconds of audio
    for b in (1, 8, 32, 64):
        adapter.decode([True] * b, 512)  # captures (b, 512)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(20):
            handle = adapter.launch([True] * b, 512)
        codes, _ = adapter.collect(handle)
        ms = (time.perf_counter() - t0) / 20 * 1e3
        print(f"arktts 0.6b bf16 graphed frame step: batch {b:2d}: {ms:.2f} ms ({b * 46.44 / ms:.0f}x RT)")
        assert codes.shape == (b, 10) and codes.min() >= 0 and codes.max() < 4096
