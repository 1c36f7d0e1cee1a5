"""PersonaPlex on CUDA: the graphed frame equals the eager one, and fp32 CUDA keeps golden parity with moshi.
Skipped without a GPU."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

from services.talker.models.personaplex.adapter import PersonaPlexAdapter
from tests.golden_personaplex import fixture_model, load_case
from tests.unit.talker.test_personaplex_adapter import Session, _sessions, drive
from tests.unit.talker.test_personaplex_golden import _prompt, run_session

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def test_fp32_cuda_stream_equals_moshi() -> None:
    case = load_case("prompt_voice")
    model = fixture_model(case, device="cuda")
    adapter = PersonaPlexAdapter(model)
    adapter.allocate(1, model.config.context)
    m = case["prompt_frames"]
    _, made, _, _ = run_session(adapter, _prompt(case, model), case["user"], m - 1)
    np.testing.assert_array_equal(made, case["made"][m - 1 :])


@pytest.mark.parametrize("capture_all", [False, True])
def test_graphed_sessions_equal_eager(capture_all: bool) -> None:
    """Sampled sessions joining and leaving: every session's tokens equal under graphs and eager. The eager
    arm prefills padded too (``pad_prefill``), so both run the same shapes; the padded prefill against the
    unpadded one is ``test_replayed_prefill_writes_the_eager_cache``'s, within a tolerance."""
    model = fixture_model(load_case("prompt_voice"), device="cuda")
    results = []
    for graphs in (False, True):
        adapter = PersonaPlexAdapter(model)
        adapter.allocate(4, model.config.context)
        if not graphs:
            adapter.pad_prefill()
        if graphs:
            adapter.enable_cuda_graphs()
            if capture_all:
                assert adapter.prefill_graphs is not None
                want = len(adapter.graph_keys()) + len(adapter.prefill_graphs.keys())
                assert adapter.capture_all_graphs() == want
        sessions: list[Session] = _sessions(model)
        results.append(drive(adapter, sessions, ticks=20))
    for name in results[0]:
        np.testing.assert_array_equal(np.stack(results[0][name]), np.stack(results[1][name]), err_msg=name)


def test_mimi_graphed_streaming_equals_eager() -> None:
    """One duplex tick's Mimi work (encode a frame, decode a frame, per session) replayed from CUDA graphs
    gives the eager results, frame after frame, with sessions at different positions."""
    from services.codec.models.mimi.loader import random_init
    from services.codec.models.mimi.presets import tiny_config
    from services.codec.models.mimi.streaming import MimiStreamingCodec

    mimi = random_init(tiny_config(), seed=3, device="cuda")
    gen = torch.Generator().manual_seed(0)
    pcm = (torch.randn(12, 3, 1920, generator=gen) * 0.1).cuda()
    codes = torch.randint(0, 2048, (12, 3, 8, 1), generator=gen).cuda()
    slots = torch.arange(3, device="cuda")
    outs = []
    for graphs in (False, True):
        codec = MimiStreamingCodec(mimi, 3)
        pcm_in, codes_in = pcm[0].clone(), codes[0].clone()
        results: dict[str, torch.Tensor] = {}

        def tick(c: MimiStreamingCodec = codec, x=pcm_in, q=codes_in, out=results) -> None:  # noqa: ANN001
            out["codes"] = c.encode(x, slots)
            out["pcm"] = c.decode(q, slots)

        run = tick
        if graphs:
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                tick()
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                tick()
            codec.reset(slots)  # warm-up and capture advanced the streams: start them fresh
            run = graph.replay
        seq = []
        for t in range(12):
            pcm_in.copy_(pcm[t])
            codes_in.copy_(codes[t])
            run()
            seq.append((results["codes"].clone(), results["pcm"].clone()))
        outs.append(seq)
    for (c0, p0), (c1, p1) in zip(*outs, strict=True):
        torch.testing.assert_close(c0, c1, rtol=0, atol=0)
        torch.testing.assert_close(p0, p1, rtol=0, atol=1e-6)


Chunk = tuple[int, Any, int, int]


def _cache_after(
    model: Any, prompts: list[Any], kv: str, prefill: Callable[[PersonaPlexAdapter, list[Chunk]], None]
) -> list[torch.Tensor]:
    """The K/V of every slot's first ``n`` positions (``n``: one short of the shortest prompt) after
    ``prefill`` took the prompts' chunks on a fresh adapter."""
    n = min(p.length for p in prompts) - 1
    adapter = PersonaPlexAdapter(model)
    adapter.use_kv_cache_dtype(kv)
    adapter.allocate(len(prompts), model.config.context)
    prefill(adapter, [(slot, p, 0, n) for slot, p in enumerate(prompts)])
    return [t[:, :, :, :n].float() for t in (adapter.kv.k, adapter.kv.v)]


def _assert_same_cache(got: list[torch.Tensor], want: list[torch.Tensor], kv: str) -> None:
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=0.07 if kv == "fp8" else 1e-4, atol=1e-3)


@pytest.mark.parametrize("dtype,kv", [(torch.float32, "auto"), (torch.bfloat16, "fp8")])
def test_a_batched_prefill_writes_the_cache_of_solo_prefills(dtype: torch.dtype, kv: str) -> None:
    """A join burst's prompts prefilled as one call (``prefill_many``, one batched SDPA over the slots) write
    the K/V that each prompt prefilled alone writes."""
    model = fixture_model(load_case("prompt_voice"), device="cuda", dtype=dtype)
    prompts = [s.prompt for s in _sessions(model)]

    def solo(adapter: PersonaPlexAdapter, chunks: list[Chunk]) -> None:
        for chunk in chunks:
            adapter.prefill_many([chunk])

    batched = _cache_after(model, prompts, kv, lambda adapter, chunks: adapter.prefill_many(chunks))
    _assert_same_cache(batched, _cache_after(model, prompts, kv, solo), kv)


@pytest.mark.parametrize("dtype,kv", [(torch.float32, "auto"), (torch.bfloat16, "fp8")])
def test_replayed_prefill_writes_the_eager_cache(dtype: torch.dtype, kv: str) -> None:
    """Whole prompts replayed from the prefill graphs (padded to a bucket, batches split into replays of 8)
    write the K/V the eager batched prefill writes at the prompts' positions."""
    model = fixture_model(load_case("prompt_voice"), device="cuda", dtype=dtype)
    prompts = [s.prompt for s in _sessions(model)] * 3  # more prompts than a replay takes

    def replayed(adapter: PersonaPlexAdapter, chunks: list[Chunk]) -> None:
        adapter.enable_cuda_graphs()
        assert adapter.prefill_graphs is not None and adapter.prefill_graphs.capture_all() > 0
        adapter.prefill_many(chunks)

    eager = _cache_after(model, prompts, kv, lambda adapter, chunks: adapter.prefill_many(chunks))
    _assert_same_cache(_cache_after(model, prompts, kv, replayed), eager, kv)
