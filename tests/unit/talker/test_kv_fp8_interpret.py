"""The fp8 KV cache's Triton kernels on CPU through the Triton interpreter: the K/V writes (PersonaPlex's
``qkv_into_cache``, Qwen3's ``qk_norm_rope_into_cache``) store what their PyTorch fallbacks store, the pool
attention kernel reading fp8 equals ``attend_pool``'s dequantizing fallback, and a PersonaPlex fp8 frame with
every kernel on equals the fallback frame (the ring read through the pool kernel).

Runs only where Triton imports (``TRITON_INTERPRET=1 PYTHONPATH=<triton site>``); CI without Triton skips.
The GPU versions (compiled kernels, CUDA graphs) are ``tests/gpu/test_kv_fp8_cuda.py``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import numpy as np
import pytest
import torch

pytest.importorskip("triton")
if os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("CPU launches need the Triton interpreter (TRITON_INTERPRET=1)", allow_module_level=True)

import triton.language as tl  # noqa: E402
from triton.runtime import interpreter  # noqa: E402

from services.talker import kv  # noqa: E402
from services.talker.kv import attend_pool, grouped_causal_mask  # noqa: E402
from services.talker.models.personaplex.adapter import PersonaPlexAdapter  # noqa: E402
from services.talker.models.personaplex.prompt import build_prompt  # noqa: E402
from services.talker.sampling import SamplingParams  # noqa: E402
from tests.golden_personaplex import fixture_model, load_case  # noqa: E402
from tests.unit.talker.test_fused_interpret import _kernels_on_cpu, _norm, token_index  # noqa: E402, F401
from tests.unit.talker.test_pool_attention_interpret import _case, _interpreter_fixes  # noqa: E402, F401
from voxstage.nn import fused, kv_fp8, triton_attention  # noqa: E402
from voxstage.nn.layers import rope_cos_sin, rope_inv_freq  # noqa: E402


@pytest.fixture(autouse=True)
def _fp8_conversion(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The Triton 3.5 interpreter loses the carry of a mantissa that rounds up into the next binade when it
    converts fp32 to e4m3 (-7.9 becomes -4, not -8); the GPU's convert does not. Convert as torch does
    (round to nearest even; the kernels clamp before converting, so saturation never matters)."""
    convert = interpreter.InterpreterBuilder.create_fp_to_fp

    def rounded(self: object, src: interpreter.TensorHandle, dst_type: tl.dtype, mode: object) -> object:
        if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.float8e4nv:
            wide = torch.from_numpy(np.ascontiguousarray(src.data).view(np.float32))
            bits = wide.to(kv_fp8.FP8).view(torch.uint8).numpy()
            return interpreter.TensorHandle(bits, dst_type.scalar)
        return convert(self, src, dst_type, mode)

    monkeypatch.setattr(interpreter.InterpreterBuilder, "create_fp_to_fp", rounded)
    yield


def _bits(x: torch.Tensor) -> torch.Tensor:
    return x.view(torch.uint8)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rope", [True, False])
@torch.no_grad()
def test_qkv_into_cache_stores_the_fallbacks_bytes(dtype: torch.dtype, rope: bool) -> None:
    gen = torch.Generator().manual_seed(3)
    b, heads, hd, positions = 3, 2, 8, 6
    qkv = (4 * torch.randn(b, 3 * heads * hd, generator=gen)).to(dtype)
    angles = torch.randn(b, hd // 2, generator=gen)
    tables = (angles.cos(), angles.sin()) if rope else None
    scales = (torch.tensor([0.25, 2.0**-7]), torch.tensor([2.0**-5, 1.0]))  # head 1's K hits the clamp
    index = torch.tensor([1, 4, 2])
    out = []
    for enabled in (True, False):
        fused.set_triton(enabled)
        k = torch.zeros(b, heads, positions, hd, dtype=kv_fp8.FP8)
        v = torch.zeros_like(k)
        out.append((fused.qkv_into_cache(qkv, heads, k, v, index, tables, scales), k, v))
    (q1, k1, v1), (q0, k0, v0) = out
    torch.testing.assert_close(q1, q0, rtol=0, atol=0)
    assert torch.equal(_bits(k1), _bits(k0)) and torch.equal(_bits(v1), _bits(v0))
    assert k0.float().abs().max() == kv_fp8.FP8_MAX  # the clamp was exercised
    assert _bits(k0).any() and not _bits(k0)[:, :, 0].any()  # written where indexed, nowhere else


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("layout", ["dense", "broadcast"])
@torch.no_grad()
def test_qk_norm_rope_into_cache_fp8_equals_fallback(dtype: torch.dtype, layout: str) -> None:
    gen = torch.Generator().manual_seed(11)
    nh, nkv, hd, slots, max_len = 4, 2, 16, 5, 9
    qkv = (3 * torch.randn(6, (nh + 2 * nkv) * hd, generator=gen)).to(dtype)
    q_norm, k_norm = _norm(hd, dtype, gen), _norm(hd, dtype, gen)
    slot, pos = token_index(layout, [3, 0, 3, 4, 1, 0], [0, 8, 5, 2, 7, 1])
    cos, sin = rope_cos_sin(pos * 131, rope_inv_freq(hd, 1e6), dtype)
    scales = (torch.tensor([2.0**-5, 2.0**-4]), torch.tensor([2.0**-6, 2.0**-5]))
    out = []
    for enabled in (True, False):
        fused.set_triton(enabled)
        k_pool = torch.zeros(slots, nkv, max_len, hd, dtype=kv_fp8.FP8)
        v_pool = torch.zeros_like(k_pool)
        norms = (q_norm, k_norm)
        q = fused.qk_norm_rope_into_cache(qkv, nh, nkv, *norms, cos, sin, k_pool, v_pool, slot, pos, scales)
        out.append((q, k_pool, v_pool))
    (q1, k1, v1), (q0, k0, v0) = out
    tol = {"rtol": 2e-2, "atol": 2e-2} if dtype == torch.bfloat16 else {"rtol": 1e-5, "atol": 1e-5}
    torch.testing.assert_close(q1, q0, **tol)
    assert torch.equal(_bits(v1), _bits(v0))  # V is copied: the same value, the same rounding
    # K of the kernel differs from the module path by a bf16 step or two (the norm rounds once, not twice;
    # the tolerance above), which can move its e4m3 rounding by a step or two; in fp32 they agree to the
    # byte.
    k_scale = scales[0].view(-1, 1, 1)
    k1f, k0f = kv_fp8.dequantize(k1, k_scale, torch.float32), kv_fp8.dequantize(k0, k_scale, torch.float32)
    if dtype == torch.float32:
        assert torch.equal(_bits(k1), _bits(k0))
    torch.testing.assert_close(k1f, k0f, rtol=0.25, atol=2.0**-9 * 2.0**-4)


def _fp8_case(group: int, t: int, attn_len: int, dtype: torch.dtype, **kw: object):
    q, k_pool, v_pool, slot_ids, positions = _case(group, t, attn_len, dtype, **kw)  # type: ignore[arg-type]
    nkv = k_pool.shape[1]
    scales = (2.0 ** torch.arange(-3, -3 + nkv).float(), 2.0 ** -torch.arange(1, 1 + nkv).float())
    k8 = kv_fp8.quantize(k_pool, scales[0].view(-1, 1, 1))
    v8 = kv_fp8.quantize(v_pool, scales[1].view(-1, 1, 1))
    return q, k8, v8, slot_ids, positions, scales


@pytest.mark.parametrize(("group", "t", "splits"), [(1, 1, 1), (2, 2, 1), (4, 1, 3), (1, 1, 2)])
def test_pool_attention_reads_fp8_like_the_fallback(group: int, t: int, splits: int) -> None:
    q, k8, v8, slot_ids, positions, scales = _fp8_case(group, t, 150, torch.float32)
    mask = grouped_causal_mask(positions, 150, group)
    want = attend_pool(q, k8, v8, slot_ids, 150, mask, positions, scales)  # CPU: dequantize + SDPA
    got = triton_attention.pool_attention(q, k8, v8, slot_ids, positions, 150, splits, scales=scales)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_pool_attention_fp8_bf16_rows_without_slots() -> None:
    q, k8, v8, _, positions, scales = _fp8_case(1, 1, 100, torch.bfloat16, slots=False)
    mask = grouped_causal_mask(positions, 100, 1)
    want = attend_pool(q, k8, v8, None, 100, mask, positions, scales)
    got = triton_attention.pool_attention(q, k8, v8, None, positions, 100, 2, scales=scales)
    torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("name", ["prompt_voice", "ring_window"])
def test_personaplex_fp8_frames_equal_with_and_without_kernels(
    monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    """Every kernel on (K/V writes, the ring read through the pool kernel) against the PyTorch fallbacks,
    on the fp8 ring; ``ring_window``'s 24-frame ring wraps during the run."""
    case = load_case(name)
    model = fixture_model(case)
    prompt = build_prompt(model.config, voice_codes=case.get("voice"), text_ids=case["text_ids"])
    greedy = SamplingParams(do_sample=False)
    runs = []
    for enabled in (True, False):
        fused.set_triton(enabled)
        monkeypatch.setattr(kv, "_pool_kernel", lambda q, on=enabled: triton_attention if on else None)
        adapter = PersonaPlexAdapter(model)
        adapter.use_kv_cache_dtype("fp8")
        adapter.allocate(1, model.config.context)
        adapter.admit(0, seed=1, text=greedy, audio=greedy)
        adapter.prefill(0, prompt, 0, prompt.length - 1)
        adapter.start_decode(0, prompt)
        made = []
        for step in range(40):
            if step:
                adapter.set_user([0], case["user"][prompt.length - 1 + step][None])
            adapter.step([True], int(adapter.state.steps[0]), all_greedy=True)
            made.append(adapter.state.column[0, :9].clone())
        runs.append((torch.stack(made), adapter.kv.k.clone(), adapter.kv.v.clone()))
    (made1, k1, v1), (made0, k0, v0) = runs
    assert torch.equal(made1, made0)
    assert torch.equal(_bits(v1), _bits(v0))
    torch.testing.assert_close(k1.float(), k0.float(), rtol=0.125, atol=1e-6)
