"""Driving a ``TalkerEngine`` in tests, shared by the family tests here and the CUDA-graph tests in
``tests/gpu`` (whichever adapter the engine runs)."""

from __future__ import annotations

import numpy as np

from services.talker.engine import EngineConfig, TalkerEngine, TalkerOutput, TalkerRequest
from services.talker.packed import PackedDecodeAdapter

MAX_TICKS = 10_000  # a stuck engine fails the test instead of hanging it


def drive(engine: TalkerEngine, reqs: list[TalkerRequest], stagger: int = 1) -> dict[str, list[TalkerOutput]]:
    """Submit one request every ``stagger`` ticks and run until idle; returns outputs per request."""
    out: dict[str, list[TalkerOutput]] = {}
    pending = list(reqs)
    tick = 0
    while pending or engine.has_work():
        if pending and tick % stagger == 0:
            engine.submit(pending.pop(0))
        for o in engine.step():
            out.setdefault(o.request_id, []).append(o)
        tick += 1
        assert tick < MAX_TICKS
    return out


def frames_of(outs: list[TalkerOutput]) -> np.ndarray:
    return np.concatenate([o.codes for o in outs])


def run_graphed(
    adapter: PackedDecodeAdapter,
    reqs: list[TalkerRequest],
    graphs: bool,
    async_scheduling: bool = False,
    capture_all: bool = False,
) -> dict[str, np.ndarray]:
    """Frames per request of ``reqs`` (submitted every 3 ticks) over 4 slots, eager or with CUDA graphs
    (captured lazily, or all up front as the talker stage does after its warm-up request)."""
    if graphs:
        adapter.enable_cuda_graphs()
    cfg = EngineConfig(
        max_num_seqs=4, max_model_len=256, max_num_batched_tokens=32, async_scheduling=async_scheduling
    )
    eng = TalkerEngine(adapter, cfg)  # type: ignore[arg-type]  (a family adapter: the full protocol)
    if capture_all:
        decode, prefill = adapter.graph_keys()
        assert adapter.capture_all_graphs() == len(decode) + len(prefill)
    return {k: frames_of(v) for k, v in drive(eng, reqs, stagger=3).items()}
