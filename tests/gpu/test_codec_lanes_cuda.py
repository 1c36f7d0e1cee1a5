"""The codec's two lanes on a GPU (tiny preset, fp32, graphs as served; services/codec/lanes.py): each lane
captures its own graphs at start-up and no tick meets an uncaptured bucket, the urgent lane's CUDA stream has
the higher priority and its calls keep to its budget, and the audio equals the offline decode with decodes of
the two lanes running at once. Skipped without a GPU; tests/unit/codec/test_engine_lanes.py covers the CPU
path."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from services.codec.engine import ChunkSchedule, CodecOutput
from services.codec.graphs import GraphedDecode
from services.codec.lanes import LanedCodecEngine
from services.codec.models.qwen3_tts.loader import random_init
from services.codec.models.qwen3_tts.presets import decoder_preset
from services.codec.models.qwen3_tts.streaming import StreamingDecoder
from voxstage.cudagraphs import GraphCache

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
    pytest.mark.usefixtures("no_tf32"),  # conftest.py
]
STREAMS, BUCKETS = 8, (1, 2, 4, 8, 16, 25)


def laned_engine(model: torch.nn.Module, policy: str) -> LanedCodecEngine:
    pool = StreamingDecoder(model, 2 * STREAMS)

    def graphed() -> GraphedDecode:
        return GraphedDecode(pool, num_groups=16, max_batch=STREAMS, frame_buckets=BUCKETS, device="cuda")

    engine = LanedCodecEngine(
        pool, max_streams=STREAMS, schedule=ChunkSchedule(1, 25), num_groups=16, device="cuda",
        decode_fn=graphed(), urgent_calls=graphed(), urgent_budget_s=0.004, frame_buckets=BUCKETS,
        async_scheduling=True, tick_policy=policy, tick_budget_s=0.05,  # type: ignore[arg-type]
    )  # fmt: skip
    assert engine.needs_cost  # the urgent lane is bounded whatever the bulk policy
    engine.calibrate()  # the stage's warm-up order (CodecWorker._capture_graphs)
    for calls, keep in engine.start_up_calls():
        calls.capture_all(STREAMS * 25, keep)
    return engine


def run(engine: LanedCodecEngine, codes: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    out: dict[str, list[CodecOutput]] = {}
    fed = dict.fromkeys(codes, 0)
    for tick in range(5000):
        for i, (sid, c) in enumerate(codes.items()):
            if tick == 3 * i:
                engine.open(sid)
            if tick >= 3 * i and fed[sid] < len(c):
                n = min(1 + 7 * (i % 3), len(c) - fed[sid])  # producers at 1, 8 and 15 frames a tick
                engine.push(sid, c[fed[sid] : fed[sid] + n])
                fed[sid] += n
                if fed[sid] == len(c):
                    engine.finish(sid)
        if engine.has_work():
            for o in engine.step():
                out.setdefault(o.stream_id, []).append(o)
        else:
            time.sleep(engine.idle_timeout() or 0.0)
        if all(fed[s] == len(c) for s, c in codes.items()) and not engine.active():
            break
    assert engine.active() == 0
    return {sid: np.concatenate([o.pcm for o in outs]) for sid, outs in out.items()}


@pytest.mark.parametrize("policy", ["deadline", "fifo"])
def test_two_lanes_on_graphs_keep_their_graphs_and_the_audio(policy: str) -> None:
    model = random_init(decoder_preset("qwen3-tts-tiny"), 0, device="cuda", dtype=torch.float32)
    rng = np.random.default_rng(1)
    codes = {f"s{i}": rng.integers(0, 2048, (60 + 9 * i, 16), dtype=np.int64) for i in range(STREAMS)}
    engine = laned_engine(model, policy)
    assert engine.urgent.stream is not None and engine.bulk.stream is not None
    assert engine.urgent.stream.priority < engine.bulk.stream.priority
    # Each lane's graphs captured on its own stream: captured GEMMs keep that stream's cuBLAS workspace.
    assert engine.urgent.calls.graphs.capture_stream == engine.urgent.stream  # type: ignore[attr-defined]
    assert engine.bulk.calls.graphs.capture_stream == engine.bulk.stream  # type: ignore[attr-defined]
    urgent_graphs = engine.urgent.calls.graphs.keys()  # type: ignore[attr-defined]
    bulk_graphs = engine.bulk.calls.graphs.keys()  # type: ignore[attr-defined]
    assert urgent_graphs and all(engine._urgent_call(b, t) for b, t in urgent_graphs)
    got = run(engine, codes)
    assert engine.urgent.calls.graphs.keys() == urgent_graphs  # type: ignore[attr-defined]
    assert engine.bulk.calls.graphs.keys() == bulk_graphs  # type: ignore[attr-defined]
    for sid, c in codes.items():
        with torch.inference_mode():
            ref = model(torch.from_numpy(c.T.copy()).cuda()[None])[0].float().cpu().numpy()
        np.testing.assert_allclose(got[sid], ref, atol=1e-4, rtol=0)


def test_graphs_of_two_caches_replay_at_once_on_their_own_streams() -> None:
    """Two caches of long-K GEMM chains (shapes cuBLAS splits over K, through its workspace), each captured
    on its own stream as the lanes' are, replayed at once many times: every result equals the eager one.
    With one capture stream the two chains shared one workspace (pytorch/pytorch#193402)."""
    torch.manual_seed(0)
    streams = [torch.cuda.Stream(priority=-100), torch.cuda.Stream(priority=0)]
    x = [torch.randn(16, 32768, device="cuda") for _ in streams]
    w = [torch.randn(32768, 256, device="cuda") / 181 for _ in streams]
    out: list[torch.Tensor] = [torch.empty(0)] * 2

    def chain(i: int) -> None:
        out[i] = torch.tanh(x[i] @ w[i]) @ w[i].T[:256, :256]

    want = []
    for i in range(2):
        chain(i)
        want.append(out[i].clone())
    caches = [GraphCache(lambda i=i: chain(i), enabled=True) for i in range(2)]
    for cache, stream in zip(caches, streams, strict=True):
        cache.capture_stream = stream
        cache.capture()
    torch.cuda.synchronize()
    for _ in range(200):
        for cache, stream in zip(caches, streams, strict=True):
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                cache.run()
        for stream in streams:
            torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    for i in range(2):
        torch.testing.assert_close(out[i], want[i], atol=1e-3, rtol=1e-3)
