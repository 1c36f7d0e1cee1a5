"""The codec's deadline ticks on a GPU (tiny preset, fp32, graphs as served): the warm-up's calibration times
the (batch, frame) graphs, the start-up captures only the buckets a tick can call and no tick meets another,
every planned tick keeps to its budget, and the audio equals fifo's and the offline decode. Skipped without a
GPU; tests/unit/codec/test_engine_deadline.py covers the CPU path."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from services.codec.engine import ChunkSchedule, CodecEngine, CodecOutput
from services.codec.graphs import GraphedDecode
from services.codec.models.qwen3_tts.loader import random_init
from services.codec.models.qwen3_tts.presets import decoder_preset
from services.codec.models.qwen3_tts.streaming import StreamingDecoder

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
    pytest.mark.usefixtures("no_tf32"),  # conftest.py
]
STREAMS, BUCKETS = 8, (1, 2, 4, 8, 16, 25)


def engine_for(model: torch.nn.Module, policy: str, budget_s: float) -> CodecEngine:
    pool = StreamingDecoder(model, 2 * STREAMS)
    graphed = GraphedDecode(pool, num_groups=16, max_batch=STREAMS, frame_buckets=BUCKETS, device="cuda")
    engine = CodecEngine(
        pool, max_streams=STREAMS, schedule=ChunkSchedule(1, 25), num_groups=16, device="cuda",
        decode_fn=graphed, frame_buckets=BUCKETS, async_scheduling=True, tick_policy=policy,  # type: ignore[arg-type]
        tick_budget_s=budget_s,
    )  # fmt: skip
    if policy == "deadline":  # the stage's warm-up order (CodecWorker.warm_up): time, then capture what fits
        engine.calibrate()
    graphed.capture_all(STREAMS * 25, engine.plannable_call)
    return engine


def run(engine: CodecEngine, codes: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], list[float]]:
    out: dict[str, list[CodecOutput]] = {}
    fed = dict.fromkeys(codes, 0)
    planned: list[float] = []
    for tick in range(1000):
        for i, (sid, c) in enumerate(codes.items()):
            if tick == i:
                engine.open(sid)
            if tick >= i and fed[sid] < len(c):
                n = min(1 + 7 * (i % 3), len(c) - fed[sid])  # producers at 1, 8 and 15 frames a tick
                engine.push(sid, c[fed[sid] : fed[sid] + n])
                fed[sid] += n
                if fed[sid] == len(c):
                    engine.finish(sid)
        engine.planned_s = 0.0
        for o in engine.step():
            out.setdefault(o.stream_id, []).append(o)
        planned.append(engine.planned_s)
        if all(fed[s] == len(c) for s, c in codes.items()) and not engine.has_work():
            break
    return {sid: np.concatenate([o.pcm for o in outs]) for sid, outs in out.items()}, planned


def test_deadline_ticks_on_graphs_keep_the_budget_and_the_audio() -> None:
    model = random_init(decoder_preset("qwen3-tts-tiny"), 0, device="cuda", dtype=torch.float32)
    rng = np.random.default_rng(0)
    codes = {f"s{i}": rng.integers(0, 2048, (40 + 9 * i, 16), dtype=np.int64) for i in range(STREAMS)}
    fifo, _ = run(engine_for(model, "fifo", 0.02), codes)
    probe = engine_for(model, "deadline", 1.0)
    cost = probe.cost
    assert cost is not None and all(t in BUCKETS and s > 0 for (_, t), s in cost.table.items())
    # A budget of about three 25-frame rows: the bulk must split.
    budget = cost(4, 25)
    engine = engine_for(model, "deadline", budget)
    single = max(engine.cost(1, t) for t in BUCKETS)  # type: ignore[misc]
    graphs = engine.decode_fn.graphs.keys()  # type: ignore[union-attr]
    # The calibration's shapes (it times graphed calls) and the calls a tick can make, nothing else.
    assert all(engine.plannable_call(b, t) or (b, t) in engine.cost.table for b, t in graphs)  # type: ignore[union-attr]
    deadline, planned = run(engine, codes)
    assert max(planned) <= max(budget, single) + 1e-12 and sum(p > 0 for p in planned) > len(codes)
    assert engine.decode_fn.graphs.keys() == graphs  # type: ignore[union-attr]  # no tick met an uncaptured bucket
    for sid, c in codes.items():
        with torch.inference_mode():
            ref = model(torch.from_numpy(c.T.copy()).cuda()[None])[0].float().cpu().numpy()
        np.testing.assert_allclose(fifo[sid], ref, atol=1e-4, rtol=0)
        np.testing.assert_allclose(deadline[sid], ref, atol=1e-4, rtol=0)
