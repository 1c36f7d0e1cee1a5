"""The Qwen3 fused kernels on CPU through the Triton interpreter: ``qk_norm_rope_into_cache`` equals its
PyTorch fallback, and the Qwen3 backbone's fused path (every ``voxstage.nn.fused`` op a kernel) equals the
module path, for the talker and the code predictor, prefill and decode, and a whole greedy frame step.

Runs only where Triton imports (``TRITON_INTERPRET=1 PYTHONPATH=<triton site>``); CI without Triton skips.
The kernels are made to apply to CPU tensors by swapping ``fused._kernels_for``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import torch

from voxstage.nn import fused
from voxstage.nn.layers import RMSNorm, rope_cos_sin, rope_inv_freq

pytest.importorskip("triton")
if os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("CPU launches need the Triton interpreter (TRITON_INTERPRET=1)", allow_module_level=True)

import numpy as np  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.runtime import interpreter  # noqa: E402

from services.talker.models.qwen3_tts.backbone import KVCache, Qwen3Backbone  # noqa: E402
from services.talker.models.qwen3_tts.config import parse_config  # noqa: E402
from services.talker.models.qwen3_tts.frame import FrameState, frame_step  # noqa: E402
from services.talker.models.qwen3_tts.loader import random_init  # noqa: E402
from services.talker.models.qwen3_tts.model import Qwen3TTSTalker  # noqa: E402
from services.talker.models.qwen3_tts.presets import preset_config, preset_generation_config  # noqa: E402
from services.talker.sampling import Sampler, SamplingParams  # noqa: E402
from voxstage.nn import triton_kernels  # noqa: E402  (needs Triton)


@pytest.fixture(autouse=True)
def _kernels_on_cpu(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Kernels for CPU tensors; and fp32 -> bf16 casts rounded to nearest even, as on the GPU: the Triton 3.5
    interpreter truncates them, a bias that grows to several percent over a 28-layer bf16 stack."""
    monkeypatch.setattr(fused, "_kernels_for", lambda t: triton_kernels if fused.enabled() else None)
    cast = interpreter.InterpreterBuilder.cast_impl

    def rounded_cast(self: object, src: interpreter.TensorHandle, dst_type: tl.dtype) -> object:
        if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16:
            wide = torch.from_numpy(np.ascontiguousarray(src.data).view(np.float32))
            bits = wide.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
            return interpreter.TensorHandle(bits, dst_type.scalar)
        return cast(self, src, dst_type)

    monkeypatch.setattr(interpreter.InterpreterBuilder, "cast_impl", rounded_cast)
    yield
    fused.set_triton(True)


def _norm(dim: int, dtype: torch.dtype, gen: torch.Generator) -> RMSNorm:
    norm = RMSNorm(dim, eps=1e-6)
    with torch.no_grad():
        norm.weight.copy_(1 + 0.2 * torch.randn(dim, generator=gen))
    return norm.to(dtype)


def token_index(layout: str, slots: list[int], positions: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token slot and position tensors as the backbone hands them over: dense, or (one row's prompt)
    the slot broadcast over its tokens (stride 0) and the positions a strided view."""
    if layout == "dense":
        return torch.tensor(slots), torch.tensor(positions)
    spread = torch.tensor(positions).repeat_interleave(2)[::2]
    return torch.tensor(slots[:1]).expand(len(positions)), spread


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("head_dim", [16, 12])  # 12: a half that is no power of two (the tiny predictor)
@pytest.mark.parametrize("layout", ["dense", "broadcast"])
@torch.no_grad()
def test_qk_norm_rope_into_cache_equals_fallback(dtype: torch.dtype, head_dim: int, layout: str) -> None:
    gen = torch.Generator().manual_seed(head_dim)
    nh, nkv, slots, max_len = 4, 2, 5, 9
    qkv = (3 * torch.randn(6, (nh + 2 * nkv) * head_dim, generator=gen)).to(dtype)
    q_norm, k_norm = _norm(head_dim, dtype, gen), _norm(head_dim, dtype, gen)
    slot, pos = token_index(layout, [3, 0, 3, 4, 1, 0], [0, 8, 5, 2, 7, 1])
    cos, sin = rope_cos_sin(pos * 131, rope_inv_freq(head_dim, 1e6), dtype)
    before = torch.randn(slots, nkv, max_len, head_dim, generator=gen).to(dtype)
    results = []
    for enabled in (True, False):
        fused.set_triton(enabled)
        k_pool, v_pool = before.clone(), -before.clone()
        q = fused.qk_norm_rope_into_cache(qkv, nh, nkv, q_norm, k_norm, cos, sin, k_pool, v_pool, slot, pos)
        results.append((q, k_pool, v_pool))
    (q1, k1, v1), (q0, k0, v0) = results
    tol = {"rtol": 2e-2, "atol": 2e-2} if dtype == torch.bfloat16 else {"rtol": 1e-5, "atol": 1e-5}
    assert q1.shape == q0.shape == (6, nh, head_dim)
    torch.testing.assert_close(q1, q0, **tol)
    torch.testing.assert_close(k1, k0, **tol)
    torch.testing.assert_close(v1, v0, rtol=0, atol=0)
    written = torch.zeros(slots, max_len, dtype=torch.bool)
    written[slot, pos] = True
    untouched = ~written.unsqueeze(1).expand(slots, nkv, max_len)
    assert torch.equal(k1[untouched], before[untouched]) and torch.equal(v1[untouched], -before[untouched])
    assert not torch.equal(k1[~untouched], before[~untouched])


def _tiny_model() -> Qwen3TTSTalker:
    cfg = parse_config(preset_config("qwen3-tts-tiny", "custom_voice"), preset_generation_config())
    model = random_init(cfg, seed=3)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():  # non-unit norms, so a weight mixed up between norms would show
        for name, p in model.named_parameters():
            if "norm" in name:
                p.mul_(1 + 0.2 * torch.randn(p.shape, generator=gen))
    return model.eval()


@pytest.fixture(scope="module")
def tiny() -> Qwen3TTSTalker:
    return _tiny_model()


def _both(
    backbone: Qwen3Backbone, cache: KVCache, x: torch.Tensor, positions: torch.Tensor, **kw: object
) -> list[tuple[torch.Tensor, KVCache]]:
    out = []
    for enabled in (True, False):
        fused.set_triton(enabled)
        c = KVCache(cache.k.clone(), cache.v.clone())
        with torch.no_grad():
            out.append((backbone(x, positions, c, **kw), c))  # type: ignore[arg-type]
    return out


@pytest.mark.parametrize("which", ["talker", "predictor"])
def test_fused_backbone_equals_module_path(tiny: Qwen3TTSTalker, which: str) -> None:
    backbone = tiny.model if which == "talker" else tiny.code_predictor.model
    cfg = backbone.cfg
    gen = torch.Generator().manual_seed(7)
    cache = KVCache.allocate(cfg, num_slots=4, max_len=24)
    cache.k.copy_(torch.randn(cache.k.shape, generator=gen))
    cache.v.copy_(torch.randn(cache.v.shape, generator=gen))
    width = cfg.hidden_size

    # Chunked prefill of two slots (T > 1, gathered slots), then a batched decode over rows 0..B-1.
    x = torch.randn(2, 5, width, generator=gen)
    positions = torch.tensor([[3, 4, 5, 6, 7], [0, 1, 2, 3, 4]])
    (h1, c1), (h0, c0) = _both(backbone, cache, x, positions, slot_ids=torch.tensor([2, 0]), attn_len=16)
    assert h1.shape == h0.shape == (2, 5, width)
    torch.testing.assert_close(h1, h0, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(c1.k, c0.k, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(c1.v, c0.v, rtol=1e-6, atol=1e-6)

    x = torch.randn(3, 1, width, generator=gen)
    positions = torch.tensor([[8], [5], [0]])
    (h1, c1), (h0, c0) = _both(backbone, c0, x, positions, attn_len=16)
    torch.testing.assert_close(h1, h0, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(c1.k, c0.k, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(c1.v, c0.v, rtol=1e-6, atol=1e-6)


def test_fixed_call_is_built_once_and_equals_fresh_tables(tiny: Qwen3TTSTalker) -> None:
    backbone = tiny.code_predictor.model
    call = backbone.fixed_call(3, 2, 1, 16, torch.float32)
    assert backbone.fixed_call(3, 2, 1, 16, torch.float32) is call
    fresh = backbone.call_tables(torch.full((3, 1), 2), None, 16, torch.float32)
    for name in ("positions", "cos", "sin", "mask", "token_slot", "token_pos"):
        assert torch.equal(getattr(call, name), getattr(fresh, name)), name
    assert torch.equal(call.write[0], fresh.write[0]) and torch.equal(call.write[1], fresh.write[1])
    assert not call.cos.is_inference()
    with pytest.raises(ValueError, match="another shape"):
        backbone(torch.zeros(3, 1, backbone.cfg.hidden_size), call.positions,
                 tiny.allocate_predictor_cache(3), None, 15, call)  # fmt: skip


def test_fused_greedy_frames_equal_module_path(tiny: Qwen3TTSTalker) -> None:
    """A few whole frames (talker decode + frame step with the code predictor) give the same greedy codes."""
    b, groups = 2, tiny.num_code_groups
    greedy = SamplingParams(do_sample=False, repetition_penalty=1.05)
    gen = torch.Generator().manual_seed(5)
    start = torch.randn(b, 1, tiny.hidden_size, generator=gen)
    codes = {}
    for enabled in (True, False):
        fused.set_triton(enabled)
        state = FrameState.allocate(tiny, b, max_text=8)
        for slot in range(b):
            state.reset_slot(slot, seed=slot, talker=greedy, subtalker=greedy, trailing_ids=[11, 12, 13],
                             text_complete=True)  # fmt: skip
        kv = tiny.allocate_kv_cache(b, 16)
        cp_cache = tiny.allocate_predictor_cache(b)
        rows = torch.arange(b)
        x, frames = start, []
        with torch.no_grad():
            for t in range(4):
                h = tiny(x, torch.full((b, 1), t), kv, None, 16)[:, 0]
                out = frame_step(tiny, h, rows, state, cp_cache, samplers=(Sampler.GREEDY, Sampler.GREEDY))
                frames.append(out.codes)
                x = out.next_embed.unsqueeze(1)
        codes[enabled] = torch.stack(frames, dim=1)
    assert codes[True].shape == (b, 4, groups)
    assert torch.equal(codes[True], codes[False])
