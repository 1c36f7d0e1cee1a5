"""CUDA checks: a whole talker tick (decode + code predictor + sampling) captures as one CUDA graph and
replays to exactly the eager result; fp32 CUDA reproduces the CPU greedy codes."""

from __future__ import annotations

import pytest
import torch

from voxstage.talker.models.qwen3_tts.config import parse_config
from voxstage.talker.models.qwen3_tts.frame import FrameState, decode_tick, frame_step
from voxstage.talker.models.qwen3_tts.generate import TalkerRequest, generate, prefill
from voxstage.talker.models.qwen3_tts.loader import random_init
from voxstage.talker.models.qwen3_tts.presets import preset_config, preset_generation_config
from voxstage.talker.models.qwen3_tts.prompt import PromptSpec, build_prompt
from voxstage.talker.sampling import SamplingParams

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
ROLE = [151644, 300, 198]


def _snapshot(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    return [t.clone() for t in tensors]


def _restore(tensors: list[torch.Tensor], saved: list[torch.Tensor]) -> None:
    for t, s in zip(tensors, saved, strict=True):
        t.copy_(s)


@torch.no_grad()
@pytest.mark.parametrize("preset", ["qwen3-tts-tiny", "qwen3-tts-0.6b"])
def test_tick_captures_as_one_graph_and_replays_exactly(preset: str) -> None:
    cfg = parse_config(preset_config(preset, "custom_voice"), preset_generation_config())
    model = random_init(cfg, seed=0, device="cuda", dtype=torch.bfloat16)
    slots, max_len, ticks = 4, 256, 6
    cache = model.allocate_kv_cache(slots, max_len)
    pcache = model.allocate_predictor_cache(slots)
    state = FrameState.allocate(model, slots, 64)
    sampled = SamplingParams(temperature=0.9, top_k=50, top_p=0.95, repetition_penalty=1.05)
    gen = torch.Generator().manual_seed(0)
    embeds = torch.zeros(slots, model.hidden_size, device="cuda", dtype=torch.bfloat16)
    positions = torch.zeros(slots, dtype=torch.int64, device="cuda")
    for s in range(slots):
        text = torch.randint(1000, 150000, (5 + 3 * s,), generator=gen).tolist()
        prompt = build_prompt(model, PromptSpec(ROLE, text, language="english", speaker="ryan"))
        state.reset_slot(
            s,
            seed=100 + s,
            talker=sampled,
            subtalker=sampled,
            trailing_ids=prompt.trailing_ids,
            text_complete=True,
        )
        h = prefill(model, prompt.prefill_embeds, cache, s)
        out = frame_step(model, h[None], torch.tensor([s], device="cuda"), state, pcache)
        embeds[s] = out.next_embed[0]
        positions[s] = prompt.prefill_embeds.shape[0]
    rows = torch.arange(slots, device="cuda")
    mutable = [cache.k, cache.v, pcache.k, pcache.v, state.seen_c0, state.frames, embeds, positions]
    start = _snapshot(mutable)

    def run_eager() -> list[torch.Tensor]:
        codes = []
        for _ in range(ticks):
            _, out = decode_tick(model, embeds, positions, rows, cache, state, pcache, attn_len=max_len)
            embeds.copy_(out.next_embed)
            positions.add_(1)
            codes.append(out.codes.clone())
        return codes

    eager = run_eager()
    _restore(mutable, start)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm-up outside the capture (allocator, cached noise tables)
        decode_tick(model, embeds, positions, rows, cache, state, pcache, attn_len=max_len)
    torch.cuda.current_stream().wait_stream(stream)
    _restore(mutable, start)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        _, static_out = decode_tick(model, embeds, positions, rows, cache, state, pcache, attn_len=max_len)
    _restore(mutable, start)
    replayed = []
    for _ in range(ticks):
        graph.replay()
        embeds.copy_(static_out.next_embed)
        positions.add_(1)
        replayed.append(static_out.codes.clone())
    for a, b in zip(eager, replayed, strict=True):
        assert torch.equal(a, b)
    assert len({tuple(c[0].tolist()) for c in eager}) > 1  # frames actually change tick to tick


@torch.no_grad()
def test_fp32_cuda_greedy_matches_cpu() -> None:
    cfg = parse_config(preset_config("qwen3-tts-tiny", "voice_design"), preset_generation_config())
    cpu = random_init(cfg, seed=4)
    cuda = random_init(cfg, seed=4).to("cuda")
    spec = PromptSpec(ROLE, list(range(2000, 2012)), instruct_ids=[151644, 400, 198, 7, 8, 151645, 198])
    greedy = SamplingParams(do_sample=False, repetition_penalty=1.05)
    results = [
        generate(m, [TalkerRequest(build_prompt(m, spec), talker=greedy, max_new_frames=12)])[0]
        for m in (cpu, cuda)
    ]
    assert torch.equal(results[0].codes, results[1].codes.cpu())
