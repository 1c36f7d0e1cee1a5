"""The q/k kernel (``fused.qk_norm_rope_into_cache``) under a CUDA graph: a captured call replays exactly what
an eager call computes, with the per-token slot broadcast from one row (stride 0) as a one-row prefill passes
it. (Reading that slot as if dense once wrote K/V far outside the pool: an illegal address under graphs,
silent corruption eagerly. The graphed engine tests in ``tests/unit/talker/test_qwen3_tts_talker_cuda.py``
run the kernel end to end.)"""

from __future__ import annotations

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


@torch.no_grad()
def test_qk_kernel_replays_in_a_cuda_graph() -> None:
    nh, nkv, hd, slots, max_len, n = 4, 2, 16, 4, 64, 6
    norms = [RMSNorm(hd, eps=1e-6).to("cuda", torch.bfloat16) for _ in range(2)]
    inv = rope_inv_freq(hd, 1e6, "cuda")
    qkv = torch.randn(n, (nh + 2 * nkv) * hd, device="cuda", dtype=torch.bfloat16)
    row_slot = torch.zeros(1, dtype=torch.int64, device="cuda")
    slot = row_slot.expand(n)
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
        row_slot.fill_(step + 1)
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
