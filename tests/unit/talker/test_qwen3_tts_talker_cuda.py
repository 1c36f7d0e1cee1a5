"""CUDA checks: the serving tick (``Qwen3TTSAdapter.decode_core``: decode + code predictor + sampling)
captured as one CUDA graph per bucket gives exactly the eager frames through the engine, for every sampler
variant; fp32 CUDA reproduces the CPU greedy codes."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from services.talker.engine import TalkerRequest
from services.talker.models.qwen3_tts.adapter import Qwen3TTSAdapter
from services.talker.models.qwen3_tts.config import parse_config
from services.talker.models.qwen3_tts.generate import TalkerRequest as LoopRequest
from services.talker.models.qwen3_tts.generate import generate
from services.talker.models.qwen3_tts.loader import random_init
from services.talker.models.qwen3_tts.presets import preset_config, preset_generation_config
from services.talker.models.qwen3_tts.prompt import PromptSpec, build_prompt
from services.talker.models.qwen3_tts.tokenizer import QwenTextTokenizer
from services.talker.sampling import SamplingParams
from services.talker.spec import SpeechSpec
from tests.unit.talker.talker_kit import run_graphed

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
ROLE = [151644, 300, 198]


SAMPLED = SamplingParams(temperature=0.9, top_k=50, top_p=0.95, repetition_penalty=1.05)
TOPK = SamplingParams(temperature=0.9, top_k=50, repetition_penalty=1.05)
GREEDY = SamplingParams(do_sample=False, repetition_penalty=1.05)


def _requests(sampling: list[SamplingParams]) -> list[TalkerRequest]:
    texts = ["hello there", "the quick brown fox jumps", "a", "we will see the world at noon", "more"]
    return [
        TalkerRequest(f"r{i}", SpeechSpec(text=f"{texts[i % 5]} {i}", voice="ryan", language="english"),
                      100 + i, s, s, max_frames=10 + i)
        for i, s in enumerate(sampling)
    ]  # fmt: skip


# Each batch mix reaches a different sampler variant of the captured step; the released size runs one mix.
@pytest.mark.parametrize(
    "preset,mix",
    [("qwen3-tts-tiny", m) for m in ("sampled", "topk", "greedy", "mixed")] + [("qwen3-tts-0.6b", "mixed")],
)
@pytest.mark.parametrize("async_scheduling,capture_all", [(False, False), (True, False), (True, True)])
def test_graphed_engine_equals_eager(
    tiny_tokenizer: QwenTextTokenizer, preset: str, mix: str, async_scheduling: bool, capture_all: bool
) -> None:
    """The serving path (``Qwen3TTSAdapter.decode_core`` through the engine) graphed equals it eager."""
    cfg = parse_config(preset_config(preset, "custom_voice"), preset_generation_config())
    model = random_init(cfg, seed=0, device="cuda", dtype=torch.bfloat16)
    sampling = {"sampled": [SAMPLED] * 6, "topk": [TOPK] * 6, "greedy": [GREEDY] * 6}.get(
        mix, [SAMPLED, GREEDY, TOPK, GREEDY, TOPK, SAMPLED]
    )
    reqs = _requests(sampling)
    eager = run_graphed(Qwen3TTSAdapter(model, tiny_tokenizer), reqs, False)
    graph = run_graphed(Qwen3TTSAdapter(model, tiny_tokenizer), reqs, True, async_scheduling, capture_all)
    assert eager.keys() == graph.keys() == {r.request_id for r in reqs}
    for k in eager:
        assert np.array_equal(eager[k], graph[k]), k
    assert len({tuple(f) for f in eager["r0"].tolist()}) > 1  # frames actually change tick to tick


@torch.no_grad()
def test_fp32_cuda_greedy_matches_cpu() -> None:
    cfg = parse_config(preset_config("qwen3-tts-tiny", "voice_design"), preset_generation_config())
    cpu = random_init(cfg, seed=4)
    cuda = random_init(cfg, seed=4).to("cuda")
    spec = PromptSpec(ROLE, list(range(2000, 2012)), instruct_ids=[151644, 400, 198, 7, 8, 151645, 198])
    greedy = SamplingParams(do_sample=False, repetition_penalty=1.05)
    results = [
        generate(m, [LoopRequest(build_prompt(m, spec), talker=greedy, max_new_frames=12)])[0]
        for m in (cpu, cuda)
    ]
    assert torch.equal(results[0].codes, results[1].codes.cpu())


def test_prefill_and_text_uploads_do_not_wait_for_the_device(tiny_tokenizer: QwenTextTokenizer) -> None:
    """An admission, a prefill and a text delta must not make the host wait for the frame step in flight
    (async scheduling): any synchronizing copy raises under the sync debug mode."""
    cfg = parse_config(preset_config("qwen3-tts-tiny", "custom_voice"), preset_generation_config())
    adapter = Qwen3TTSAdapter(random_init(cfg, seed=0, device="cuda", dtype=torch.bfloat16), tiny_tokenizer)
    adapter.allocate(4, 256)
    prepared = adapter.prepare(SpeechSpec(text="hello there", voice="ryan", language="english"))
    adapter.admit(0, prepared, seed=0, sampling=GREEDY, subtalker=GREEDY, min_frames=2)
    adapter.decode([False], 64)  # lazy initialisation outside the checked region
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        adapter.admit(1, prepared, seed=1, sampling=SAMPLED, subtalker=TOPK, min_frames=2)
        adapter.prefill_many([(0, prepared, 0, prepared.length - 1)])
        adapter.append_text(0, 0, [1000, 1001, 1002], False)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    torch.cuda.synchronize()
    assert adapter.state.text_ids[0, :3].tolist() == [1000, 1001, 1002]
