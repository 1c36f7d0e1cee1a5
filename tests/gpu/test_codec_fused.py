"""The codec decoders' fused CUDA paths equal their PyTorch ones (needs CUDA + Triton):

* the Snake kernel (``voxstage.nn.snake``) against its fallback, op by op;
* SDPA window attention (``WindowKVAttention.attend_heads``) against the eager attention;
* whole streaming decodes with the kernels switched on vs off (``voxstage.nn.fused.set_triton``), fp32 and
  bf16 (the graphed decode with the kernels on is ``test_cuda_graphs.test_codec_graph_equals_eager``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import torch

from services.codec.models.audio8_tts.config import Audio8CodecConfig
from services.codec.models.audio8_tts.loader import random_init as random_audio8
from services.codec.models.audio8_tts.streaming import Audio8StreamingDecoder
from services.codec.models.qwen3_tts.loader import random_init as random_qwen3
from services.codec.models.qwen3_tts.presets import decoder_preset
from services.codec.models.qwen3_tts.streaming import StreamingDecoder
from services.codec.stream_layers import WindowKVAttention, window_mask
from tests.unit.codec.codec_kit import audio8_codes, random_codes
from voxstage.nn import fused, snake

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available() or not snake.triton_available(), reason="needs CUDA + Triton"
    ),
]


@pytest.fixture(autouse=True)
def _no_tf32_kernels_on() -> Iterator[None]:
    """fp32 comparisons at 1e-5 need true fp32 convs/matmuls; every test leaves the kernels switched on."""
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved
    fused.set_triton(True)


def both(fn: Callable[[], torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """``fn()`` with the Triton kernels on, then off."""
    fused.set_triton(True)
    on = fn()
    fused.set_triton(False)
    try:
        off = fn()
    finally:
        fused.set_triton(True)
    return on, off


# ---- the Snake kernel against its fallback ---------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", [(64, 96, 4800), (3, 1536, 4), (2, 7, 1), (5, 33, 1029)])
@pytest.mark.parametrize("plain", [False, True])
def test_snake_kernel_equals_fallback(dtype: torch.dtype, shape: tuple[int, int, int], plain: bool) -> None:
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = (torch.randn(shape, device="cuda", generator=gen) * 30).to(dtype)  # sin arguments up to ~1000
    c = shape[1]
    alpha = (torch.rand(1, c, 1, device="cuda", generator=gen) * 4 - 2).exp()
    inv = None if plain else 1.0 / (torch.rand(1, c, 1, device="cuda", generator=gen) * 4 - 2).exp()
    on, off = both(lambda: snake.snake(x, alpha, inv))
    assert on.dtype == dtype and on.shape == x.shape
    if dtype == torch.float32:  # FMA contraction and libdevice vs CUDA sinf: a few ulp
        torch.testing.assert_close(on, off, rtol=1e-6, atol=1e-5)
    else:  # both round the same fp32 value once: at most one step apart where it sits near a tie
        step = 2.0**-7 if dtype == torch.bfloat16 else 2.0**-10
        assert ((on.float() - off.float()).abs() <= step * off.float().abs().clamp_min(1.0)).all()
        assert (on == off).float().mean() > 0.99


def test_snake_kernel_strided_input() -> None:
    """A cropped transposed-conv output (``[..., :n*stride]``) and a transposed tensor."""
    base = torch.randn(4, 48, 1000, device="cuda", dtype=torch.bfloat16) * 5
    alpha, inv = torch.rand(1, 40, 1, device="cuda") + 0.5, torch.rand(1, 40, 1, device="cuda") + 0.5
    for x in (base[:, 4:44, 100:900], base.transpose(1, 2).contiguous().transpose(1, 2)[:, :40]):
        on, off = both(lambda x=x: snake.snake(x, alpha, inv))
        torch.testing.assert_close(on.float(), off.float(), rtol=1e-2, atol=1e-2)


# ---- SDPA window attention against the eager one ---------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("heads,kv_heads", [(16, 16), (4, 2)])
def test_sdpa_attention_equals_eager(dtype: torch.dtype, heads: int, kv_heads: int) -> None:
    b, t, d, window = 3, 25, 64, 72
    attn = WindowKVAttention(heads, kv_heads, d, window)
    gen = torch.Generator(device="cuda").manual_seed(1)
    q = torch.randn(b, heads, t, d, device="cuda", generator=gen).to(dtype)
    k = torch.randn(b, kv_heads, window - 1 + t, d, device="cuda", generator=gen).to(dtype)
    v = torch.randn(b, kv_heads, window - 1 + t, d, device="cuda", generator=gen).to(dtype)
    start = torch.tensor([0, 5, 300], device="cuda")  # a fresh stream (hidden zero history) and two later
    q_pos = start[:, None] + torch.arange(t, device="cuda")
    k_pos = start[:, None] - (window - 1) + torch.arange(window - 1 + t, device="cuda")
    mask = window_mask(q_pos, k_pos, window)
    fast = attn.attend_heads(q, k, v, mask)
    assert fast.dtype == dtype and fast.shape == q.shape
    # The eager attention in fp32 is the reference for both dtypes: in bf16 it rounds its scores, which
    # SDPA keeps in fp32, so bf16 eager is no closer to the truth than SDPA.
    group = heads // kv_heads
    kf, vf = k.float().repeat_interleave(group, 1), v.float().repeat_interleave(group, 1)
    eager = attn.attend(q.float(), kf, vf, mask)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(fast.float(), eager, rtol=tol, atol=tol)


# ---- whole decoders, kernels on vs off -------------------------------------------------------------------


def stream(pool: StreamingDecoder | Audio8StreamingDecoder, codes: torch.Tensor, chunk: int) -> torch.Tensor:
    """Decode ``codes`` [B, Q, T] chunk by chunk from fresh slots 0..B-1."""
    slots = torch.arange(codes.shape[0], device="cuda")
    pool.reset(slots)
    pieces = [pool.decode(codes[..., i : i + chunk], slots) for i in range(0, codes.shape[-1], chunk)]
    return torch.cat(pieces, -1)


def assert_tracks(on: torch.Tensor, off: torch.Tensor, dtype: torch.dtype) -> None:
    assert on.dtype == off.dtype == dtype and torch.isfinite(on).all()
    if dtype == torch.float32:
        torch.testing.assert_close(on, off, rtol=0, atol=1e-4)
    else:  # one-step bf16 differences in the activations compound over ~30 layers
        cos = torch.nn.functional.cosine_similarity(on.float(), off.float(), dim=-1).min().item()
        assert cos > 0.995, cos


@pytest.mark.parametrize("preset", ["qwen3-tts-tiny", "qwen3-tts-0.6b"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_qwen3_decoder_kernels_on_equals_off(preset: str, dtype: torch.dtype) -> None:
    model = random_qwen3(decoder_preset(preset), seed=0, device="cuda", dtype=dtype)
    pool = StreamingDecoder(model, max_streams=4)
    codes = random_codes(3, 40, batch=3).cuda()
    on, off = both(lambda: stream(pool, codes, 8))
    assert_tracks(on, off, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_audio8_decoder_kernels_on_equals_off(dtype: torch.dtype) -> None:
    model = random_audio8(Audio8CodecConfig.tiny(), seed=0, device="cuda", dtype=dtype)
    pool = Audio8StreamingDecoder(model, max_streams=2)
    codes = audio8_codes(4, 32, batch=2).cuda()
    on, off = both(lambda: stream(pool, codes, 8))
    assert_tracks(on, off, dtype)
