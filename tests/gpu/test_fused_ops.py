"""The Triton kernels of ``voxstage.nn.fused`` equal their PyTorch fallbacks on the GPU (needs CUDA)."""

from __future__ import annotations

import pytest
import torch

from services.talker.models.qwen3_tts.backbone import KVCache
from services.talker.models.qwen3_tts.config import parse_config
from services.talker.models.qwen3_tts.frame import FrameState, frame_step
from services.talker.models.qwen3_tts.loader import random_init
from services.talker.models.qwen3_tts.model import Qwen3TTSTalker
from services.talker.models.qwen3_tts.presets import preset_config, preset_generation_config
from services.talker.sampling import Sampler, SamplingParams
from voxstage.nn import fused
from voxstage.nn.layers import RMSNorm, rope_cos_sin, rope_inv_freq

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available() or not fused.triton_available(), reason="needs CUDA + Triton"
    ),
]


def both(fn, *args):  # type: ignore[no-untyped-def]
    fused.set_triton(True)
    a = fn(*args)
    fused.set_triton(False)
    try:
        b = fn(*args)
    finally:
        fused.set_triton(True)
    return a, b


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_add_rmsnorm(dtype: torch.dtype) -> None:
    x = torch.randn(5, 4096, device="cuda", dtype=dtype)
    d = torch.randn(5, 4096, device="cuda", dtype=dtype)
    alpha = (1 + 0.1 * torch.randn(1, 1, 4096, device="cuda")).to(dtype)
    (s1, y1), (s0, y0) = both(fused.add_rmsnorm, x, d, alpha, 1e-8)
    torch.testing.assert_close(s1, s0, rtol=0, atol=0)
    tol = 1e-2 if dtype == torch.bfloat16 else 1e-5
    torch.testing.assert_close(y1, y0, rtol=tol, atol=tol)
    (_, z1), (_, z0) = both(fused.add_rmsnorm, x[:, :1000], None, alpha[..., :1000], 1e-8)
    torch.testing.assert_close(z1, z0, rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_silu_mul(dtype: torch.dtype) -> None:
    y = torch.randn(3, 2 * 2816, device="cuda", dtype=dtype)
    a, b = both(fused.silu_mul, y)
    tol = 1e-2 if dtype == torch.bfloat16 else 1e-6
    torch.testing.assert_close(a, b, rtol=tol, atol=tol)


@pytest.mark.parametrize("rope", [True, False])
def test_qkv_into_cache(rope: bool) -> None:
    b, heads, hd, window = 4, 8, 128, 50
    qkv = torch.randn(b, 3 * heads * hd, device="cuda", dtype=torch.bfloat16)
    positions = torch.tensor([0, 7, 49, 120], device="cuda")
    index = positions % window
    ds = torch.arange(hd // 2, device="cuda", dtype=torch.float32)
    angles = positions.float().unsqueeze(-1) * torch.exp(ds * (-9.21 * 2 / hd))
    tables = (torch.cos(angles), torch.sin(angles)) if rope else None
    caches = []
    outs = []
    for enabled in (True, False):
        fused.set_triton(enabled)
        k = torch.zeros(6, heads, window, hd, device="cuda", dtype=torch.bfloat16)
        v = torch.zeros_like(k)
        outs.append(fused.qkv_into_cache(qkv, heads, k, v, index, tables))
        caches.append((k, v))
    fused.set_triton(True)
    torch.testing.assert_close(outs[0], outs[1], rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(caches[0][0], caches[1][0], rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(caches[0][1], caches[1][1], rtol=0, atol=0)
    assert caches[0][0][4:].abs().sum() == 0  # only the batch's rows were written


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("head_dim", [128, 12])  # 12: the tiny predictor's (a half that is no power of two)
@pytest.mark.parametrize("layout", ["dense", "broadcast"])
@torch.no_grad()
def test_qk_norm_rope_into_cache(dtype: torch.dtype, head_dim: int, layout: str) -> None:
    nh, nkv, slots, max_len = 16, 8, 6, 40
    qkv = (3 * torch.randn(5, (nh + 2 * nkv) * head_dim, device="cuda")).to(dtype)
    norms = []
    for _ in range(2):
        norm = RMSNorm(head_dim, eps=1e-6).to("cuda")
        norm.weight.copy_(1 + 0.2 * torch.randn(head_dim, device="cuda"))
        norms.append(norm.to(dtype))
    slot = torch.tensor([4, 0, 4, 2, 5], device="cuda")
    pos = torch.tensor([0, 39, 17, 3, 1], device="cuda")
    if layout == "broadcast":  # one row's prompt: its slot broadcast over the tokens (stride 0), as served
        slot, pos = slot[:1].expand(5), pos.repeat_interleave(2)[::2]
    cos, sin = rope_cos_sin(pos * 97, rope_inv_freq(head_dim, 1e6, "cuda"), dtype)
    before = torch.randn(slots, nkv, max_len, head_dim, device="cuda").to(dtype)
    results = []
    for enabled in (True, False):
        fused.set_triton(enabled)
        k_pool, v_pool = before.clone(), -before.clone()
        q = fused.qk_norm_rope_into_cache(qkv, nh, nkv, *norms, cos, sin, k_pool, v_pool, slot, pos)
        results.append((q, k_pool, v_pool))
    fused.set_triton(True)
    (q1, k1, v1), (q0, k0, v0) = results
    tol = 3e-2 if dtype == torch.bfloat16 else 1e-5
    torch.testing.assert_close(q1, q0, rtol=tol, atol=tol)
    torch.testing.assert_close(k1, k0, rtol=tol, atol=tol)
    torch.testing.assert_close(v1, v0, rtol=0, atol=0)
    written = torch.zeros(slots, max_len, dtype=torch.bool, device="cuda")
    written[slot, pos] = True
    untouched = ~written.unsqueeze(1).expand(slots, nkv, max_len)
    assert torch.equal(k1[untouched], before[untouched]) and torch.equal(v1[untouched], -before[untouched])


def _qwen3(preset: str, dtype: torch.dtype) -> Qwen3TTSTalker:
    cfg = parse_config(preset_config(preset, "custom_voice"), preset_generation_config())
    model = random_init(cfg, seed=0, device="cuda", dtype=dtype)
    with torch.no_grad():  # non-unit norms, so a weight mixed up between norms would show
        for name, p in model.named_parameters():
            if "norm" in name:
                p.mul_(1 + 0.2 * torch.randn_like(p))
    return model.eval()


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


@pytest.mark.parametrize("preset", ["qwen3-tts-tiny", "qwen3-tts-0.6b"])
@pytest.mark.parametrize("which", ["talker", "predictor"])
@torch.no_grad()
def test_qwen3_stack_kernels_on_equals_off(preset: str, which: str) -> None:
    """The fused layer path against the module path in bf16, both measured against fp32 (28 random-init
    layers amplify a bf16 step to a few percent either way): a chunked prefill (T=5: its tokens as rows of
    the decode-attention kernel) and a batched decode over rows 0..B-1 (T=1), outputs and K/V."""
    model = _qwen3(preset, torch.bfloat16)
    reference = _qwen3(preset, torch.float32)
    reference.load_state_dict(model.state_dict())
    backbone = model.model if which == "talker" else model.code_predictor.model
    backbone32 = reference.model if which == "talker" else reference.code_predictor.model
    width = backbone.cfg.hidden_size
    cache = KVCache.allocate(backbone.cfg, 4, 64, "cuda", torch.float32)
    cache.k.normal_()
    cache.v.normal_()
    prefill_pos = torch.tensor([[3, 4, 5, 6, 7], [0, 1, 2, 3, 4]], device="cuda")
    calls = [
        (torch.randn(2, 5, width, device="cuda"), prefill_pos, torch.tensor([2, 0], device="cuda")),
        (torch.randn(3, 1, width, device="cuda"), torch.tensor([[8], [5], [0]], device="cuda"), None),
    ]
    for x, positions, slot_ids in calls:
        outs = []
        for net, dtype, enabled in ((backbone, torch.bfloat16, True), (backbone, torch.bfloat16, False),
                                    (backbone32, torch.float32, False)):  # fmt: skip
            fused.set_triton(enabled)
            c = KVCache(cache.k.to(dtype, copy=True), cache.v.to(dtype, copy=True))
            outs.append((net(x.to(dtype), positions, c, slot_ids, 32), c))
        fused.set_triton(True)
        (h1, c1), (h0, c0), (h32, c32) = outs
        assert h1.shape == h0.shape == x.shape and h1.dtype == h0.dtype == torch.bfloat16
        for got, module_path, exact in ((h1, h0, h32), (c1.k, c0.k, c32.k), (c1.v, c0.v, c32.v)):
            err, err_module = _rel(got, exact), _rel(module_path, exact)
            assert err <= 1.25 * err_module + 1e-3, (err, err_module, which, preset)
            assert _rel(got, module_path) < 5e-2
        cache = c32


def _greedy_frames(model: Qwen3TTSTalker, b: int, frames: int) -> torch.Tensor:
    greedy = SamplingParams(do_sample=False, repetition_penalty=1.05)
    state = FrameState.allocate(model, b, max_text=8)
    for slot in range(b):
        state.reset_slot(slot, seed=slot, talker=greedy, subtalker=greedy, trailing_ids=[11, 12, 13],
                         text_complete=True)  # fmt: skip
    kv, cp_cache = model.allocate_kv_cache(b, 32), model.allocate_predictor_cache(b)
    rows = torch.arange(b, device="cuda")
    gen = torch.Generator(device="cuda").manual_seed(5)
    x = torch.randn(b, 1, model.hidden_size, device="cuda", generator=gen).to(model.codec_head.weight.dtype)
    codes = []
    for t in range(frames):
        h = model(x, torch.full((b, 1), t, device="cuda"), kv, None, 32)[:, 0]
        out = frame_step(model, h, rows, state, cp_cache, samplers=(Sampler.GREEDY, Sampler.GREEDY))
        codes.append(out.codes)
        x = out.next_embed.unsqueeze(1).to(x.dtype)
    return torch.stack(codes, dim=1)


@pytest.mark.parametrize("preset", ["qwen3-tts-tiny", "qwen3-tts-0.6b"])
@torch.no_grad()
def test_qwen3_frames_kernels_on_equal_off(preset: str) -> None:
    """Whole frames (talker decode + code predictor + sampling). fp32: the greedy codes are equal (kernels
    differ from the module path by rounding order only). bf16: a random-init model's logits lie too close
    together for equal greedy codes under a bf16 step of noise, so the first frame's talker and predictor
    states are checked instead: no further from fp32 than the module path's."""
    model32 = _qwen3(preset, torch.float32)
    codes = []
    for enabled in (True, False):
        fused.set_triton(enabled)
        codes.append(_greedy_frames(model32, 3, 4))
    fused.set_triton(True)
    assert torch.equal(codes[0], codes[1])

    model = _qwen3(preset, torch.bfloat16)
    model32.load_state_dict(model.state_dict())
    x = torch.randn(3, 1, model.hidden_size, device="cuda")
    outs = []
    for net, dtype, enabled in ((model, torch.bfloat16, True), (model, torch.bfloat16, False),
                                (model32, torch.float32, False)):  # fmt: skip
        fused.set_triton(enabled)
        cp = net.code_predictor
        h = net(x.to(dtype), torch.zeros(3, 1, dtype=torch.int64, device="cuda"), net.allocate_kv_cache(3, 8))
        call = cp.model.fixed_call(3, 0, 2, net.num_code_groups, dtype)
        y = cp.small_to_mtp_projection(torch.cat([h, x.to(dtype)], dim=1))
        outs.append((h, cp.model(y, call.positions, net.allocate_predictor_cache(3), None, None, call)))
    fused.set_triton(True)
    for part in (0, 1):
        err, err_module = _rel(outs[0][part], outs[2][part]), _rel(outs[1][part], outs[2][part])
        assert err <= 1.25 * err_module + 1e-3, (err, err_module, part, preset)
