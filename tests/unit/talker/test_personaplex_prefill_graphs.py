"""Whole prompts prefilled padded to a length bucket (what a CUDA-graphed talker replays), on CPU with the
fixture weights: the same frames as the unpadded prefill, the bucket and batch rules."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from services.talker.duplex.engine import DuplexConfig, DuplexEngine, DuplexRequest
from services.talker.models.personaplex.adapter import PersonaPlexAdapter
from services.talker.models.personaplex.model import PersonaPlexLM
from services.talker.models.personaplex.prefill_graphs import PrefillGraphs
from services.talker.sampling import SamplingParams
from tests.golden_personaplex import fixture_model, load_case

TEXT = SamplingParams(temperature=0.7, top_k=25)
AUDIO = SamplingParams(temperature=0.8, top_k=250)


@pytest.fixture(scope="module")
def model() -> PersonaPlexLM:
    return fixture_model(load_case("prompt_voice"))


def frames_of(model: PersonaPlexLM, padded: bool, sessions: int = 5, ticks: int = 6) -> dict[str, list]:
    """A burst of ``sessions`` joins (prompts of two lengths), then ``ticks`` ticks of user frames."""
    adapter = PersonaPlexAdapter(model)
    cfg = DuplexConfig(max_sessions=sessions, window=model.config.context, prefill_budget=4096)
    eng = DuplexEngine(adapter, cfg, clock=lambda: 0.0)  # steps only when every session has its frame
    if padded:
        adapter.pad_prefill()
    out: dict[str, list] = {}
    for i in range(sessions):
        codes = np.random.default_rng(i).integers(0, 2048, size=(3 + i, 8)) if i % 2 else None
        eng.open(DuplexRequest(f"s{i}", "", None, codes, seed=7 + i, text=TEXT, audio=AUDIO))
    while eng.has_work():
        for o in eng.step():
            out.setdefault(o.session_id, []).append(o.tokens)
    for t in range(ticks):
        for i in range(sessions):
            eng.push_user(f"s{i}", t, np.random.default_rng(100 * i + t).integers(0, 2048, size=(1, 8)))
        for o in eng.step():
            out.setdefault(o.session_id, []).append(o.tokens)
    return out


def test_padded_prefill_gives_the_same_frames(model: PersonaPlexLM) -> None:
    plain, padded = frames_of(model, padded=False), frames_of(model, padded=True)
    assert sorted(plain) == sorted(padded) and all(len(v) >= 6 for v in plain.values())
    for sid in plain:
        np.testing.assert_array_equal(np.stack(padded[sid]), np.stack(plain[sid]), err_msg=sid)
    # The burst's first call (every prompt from 0 to the shortest's end) took the padded path, the longer
    # prompts' rest the eager one: both paths are in these frames.


def test_the_padded_cache_matches_at_the_prompt_positions(model: PersonaPlexLM) -> None:
    caches = []
    for padded in (False, True):
        adapter = PersonaPlexAdapter(model)
        adapter.allocate(3, model.config.context)
        if padded:
            adapter.pad_prefill()
        prompt = adapter.prepare(voice_codes=np.random.default_rng(3).integers(0, 2048, size=(4, 8)))
        n = prompt.length - 1
        adapter.prefill_many([(2, prompt, 0, n)])
        caches.append((adapter.kv.k[:, 2, :, :n].clone(), adapter.kv.v[:, 2, :, :n].clone()))
        assert int(adapter.state.steps[2]) == n  # the parking position, as the eager path sets it
    for a, b in zip(caches[0], caches[1], strict=True):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)


def test_buckets_and_batches(model: PersonaPlexLM) -> None:
    adapter = PersonaPlexAdapter(model)
    adapter.allocate(20, model.config.context)
    graphs = PrefillGraphs(model, adapter.kv, graphs=False, pads=(8, 16), max_batch=3)
    assert graphs.pad_for(0, 5) == 8 and graphs.pad_for(0, 8) == 8 and graphs.pad_for(0, 9) == 16
    assert graphs.pad_for(0, 17) is None and graphs.pad_for(4, 5) is None  # too long; not from 0
    replays: list[tuple[int, ...]] = []
    real = graphs.cache.run
    graphs.cache.run = lambda *key: (replays.append(key), real(*key))  # type: ignore[method-assign]
    rows = torch.randn(7 * 5, model.config.dim, dtype=model.dtype)
    graphs.run(rows, torch.arange(7), n=5, pad=8)
    assert replays == [(3, 8), (3, 8), (1, 8)]  # seven prompts: two full replays and one of one
