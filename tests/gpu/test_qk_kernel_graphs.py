"""The parked q/k kernel (``fused.QK_KERNEL``) under CUDA graphs: alone, and inside the graphed Qwen3 engine.

Alone, a captured call must replay exactly what an eager call computes. Inside the engine it faults today
(illegal address, 2026-12-01): that run goes in a child process, because the fault poisons the process's CUDA
context for every later test, and it is a strict xfail, so the fix shows up as an unexpected pass.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from voxstage.nn import fused
from voxstage.nn.layers import RMSNorm, rope_cos_sin, rope_inv_freq

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available() or not fused.triton_available(), reason="needs CUDA + Triton"
    ),
]
REPO = Path(__file__).resolve().parents[2]


@torch.no_grad()
def test_qk_kernel_replays_in_a_cuda_graph(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fused, "QK_KERNEL", True)
    nh, nkv, hd, slots, max_len, n = 4, 2, 16, 4, 64, 6
    norms = [RMSNorm(hd, eps=1e-6).to("cuda", torch.bfloat16) for _ in range(2)]
    inv = rope_inv_freq(hd, 1e6, "cuda")
    qkv = torch.randn(n, (nh + 2 * nkv) * hd, device="cuda", dtype=torch.bfloat16)
    slot = torch.zeros(n, dtype=torch.int64, device="cuda")
    pos = torch.arange(n, device="cuda")
    cos, sin = rope_cos_sin(pos, inv, torch.bfloat16)
    k_pool = torch.zeros(slots, nkv, max_len, hd, device="cuda", dtype=torch.bfloat16)
    v_pool = torch.zeros_like(k_pool)

    def call() -> torch.Tensor:
        return fused.qk_norm_rope_into_cache(qkv, nh, nkv, *norms, cos, sin, k_pool, v_pool, slot, pos)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # compile and warm up off the capture, as voxstage.cudagraphs does
        call()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        q_graph = call()
    for step in range(3):  # new rows at new slots and positions, copied into the captured inputs
        qkv.copy_(torch.randn_like(qkv))
        slot.copy_(torch.randint(0, slots, (n,), device="cuda"))
        pos.copy_(torch.randperm(max_len, device="cuda")[:n])
        c, s = rope_cos_sin(pos, inv, torch.bfloat16)
        cos.copy_(c)
        sin.copy_(s)
        graph.replay()
        k_graph, v_graph = k_pool.clone(), v_pool.clone()
        q_eager = call()
        torch.cuda.synchronize()
        assert torch.equal(q_graph, q_eager), step
        assert torch.equal(k_graph, k_pool) and torch.equal(v_graph, v_pool), step


@pytest.mark.xfail(strict=True, reason="fused.QK_KERNEL faults under CUDA graphs in the engine (issue 14)")
def test_graphed_qwen3_engine_with_the_qk_kernel() -> None:
    args = ["-q", "-p", "no:cacheprovider", "tests/unit/talker/test_qwen3_tts_talker_cuda.py"]
    args += ["-k", "test_graphed_engine_equals_eager and tiny-sampled"]
    lines = ["import sys, pytest", "from voxstage.nn import fused", "fused.QK_KERNEL = True"]
    code = "\n".join([*lines, f"sys.exit(pytest.main({args!r}))"])
    run = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
