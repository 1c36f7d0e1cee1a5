"""The Audio8 decode half against an independent plain-torch reading of models.md §2.5 (tiny weights, 1e-5).

The readings below use only the raw state dict (by checkpoint key), ``F.conv1d`` with explicit padding, an
overlap-add written out for the transposed convs, per-head attention with an explicit window mask, and
complex-number RoPE over a bf16 table built the way the reference builds it. None of them calls the
package's modules or helpers. The released geometry is also built on ``meta`` to check it is size-true.
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from services.codec.models.audio8_tts.codec import Audio8Codec
from services.codec.models.audio8_tts.config import Audio8CodecConfig, TransformerGeometry
from services.codec.models.audio8_tts.loader import random_init
from tests.unit.codec.codec_kit import audio8_codes

TOL = 1e-5
SPF = 2048


@pytest.fixture(scope="module")
def model() -> Audio8Codec:
    return random_init(Audio8CodecConfig.tiny(), seed=0)


@pytest.fixture(scope="module")
def sd(model: Audio8Codec) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


_codes = audio8_codes


# -- independent readings ----------------------------------------------------------------------------------
def ref_vq(sd: dict[str, torch.Tensor], codes: torch.Tensor) -> torch.Tensor:
    """Sum over codebooks of out_proj(codebook[code]); residual codes clamped to 1023."""
    out = 0
    for q in range(10):
        prefix = (
            "quantizer.semantic_quantizer.quantizers.0"
            if q == 0
            else f"quantizer.quantizer.quantizers.{q - 1}"
        )
        table = sd[f"{prefix}.codebook.weight"]
        idx = codes[:, q].clamp(max=table.shape[0] - 1)
        vec = table[idx]  # [B, T, 8]
        w, b = sd[f"{prefix}.out_proj.weight"][:, :, 0], sd[f"{prefix}.out_proj.bias"]
        out = out + (vec @ w.T + b).transpose(1, 2)
    return out


def ref_rms(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * w


def ref_rope(x: torch.Tensor, base: float = 10000.0) -> torch.Tensor:
    """x [T, H, D]: pairs (2i, 2i+1) as complex numbers times the bf16-rounded e^{i p theta_i}."""
    t, _, d = x.shape
    freqs = 1.0 / (base ** (torch.arange(0, d, 2).float() / d))
    table = torch.polar(torch.ones(t, d // 2), torch.outer(torch.arange(t).float(), freqs))
    table = torch.complex(table.real.bfloat16().float(), table.imag.bfloat16().float())
    rotated = torch.view_as_complex(x.float().reshape(t, -1, d // 2, 2).contiguous()) * table[:, None, :]
    return torch.view_as_real(rotated).reshape(t, -1, d)


def ref_post_module(sd: dict[str, torch.Tensor], x: torch.Tensor, g: TransformerGeometry) -> torch.Tensor:
    """x [B, C, T] -> [B, C, T], batch element by element, head by head."""
    outs = []
    for xb in x.transpose(1, 2):  # [T, C]
        t = xb.shape[0]
        i, j = torch.arange(t)[:, None], torch.arange(t)[None, :]
        visible = (j <= i) & (j > i - g.window)
        h = xb
        for n in range(g.layers):
            p = f"quantizer.post_module.layers.{n}."
            a = ref_rms(h, sd[p + "attention_norm.weight"])
            qkv = a @ sd[p + "attention.wqkv.weight"].T
            q = qkv[:, : g.heads * g.head_dim].reshape(t, g.heads, g.head_dim)
            k = qkv[:, g.heads * g.head_dim : (g.heads + g.kv_heads) * g.head_dim].reshape(t, g.kv_heads, -1)
            v = qkv[:, (g.heads + g.kv_heads) * g.head_dim :].reshape(t, g.kv_heads, g.head_dim)
            q, k = ref_rope(q), ref_rope(k)
            heads = []
            for head in range(g.heads):
                kv = head // (g.heads // g.kv_heads)
                s = (q[:, head] @ k[:, kv].T) / math.sqrt(g.head_dim)
                s = s.masked_fill(~visible, float("-inf"))
                heads.append(torch.softmax(s, -1) @ v[:, kv])
            attn = torch.cat(heads, -1) @ sd[p + "attention.wo.weight"].T
            h = h + sd[p + "attention_layer_scale.gamma"] * attn
            f = ref_rms(h, sd[p + "ffn_norm.weight"])
            ff = (
                F.silu(f @ sd[p + "feed_forward.w1.weight"].T) * (f @ sd[p + "feed_forward.w3.weight"].T)
            ) @ sd[p + "feed_forward.w2.weight"].T
            h = h + sd[p + "ffn_layer_scale.gamma"] * ff
        outs.append(ref_rms(h, sd["quantizer.post_module.norm.weight"]).T)
    return torch.stack(outs)


def ref_causal_conv(
    x: torch.Tensor, sd: dict[str, torch.Tensor], p: str, dil: int = 1, groups: int = 1
) -> torch.Tensor:
    w, b = sd[p + ".weight"], sd[p + ".bias"]
    return F.conv1d(F.pad(x, ((w.shape[-1] - 1) * dil, 0)), w, b, dilation=dil, groups=groups)


def ref_transposed(x: torch.Tensor, sd: dict[str, torch.Tensor], p: str, stride: int) -> torch.Tensor:
    """Overlap-add written out: tap j of input t lands on output t*stride + j; then keep n*stride."""
    w, b = sd[p + ".weight"], sd[p + ".bias"]  # [in, out, k]
    bsz, _, n = x.shape
    k = w.shape[-1]
    taps = torch.einsum("bit,iok->botk", x, w)  # [B, out, n, k]
    out = torch.zeros(bsz, w.shape[1], (n + k // stride) * stride)
    for m in range(k // stride):  # taps [m*s, (m+1)*s) of every input land one stride block further
        block = taps[..., m * stride : (m + 1) * stride].reshape(bsz, w.shape[1], n * stride)
        out[..., m * stride : m * stride + n * stride] += block
    return (out + b[None, :, None])[..., : n * stride]


def ref_snake(x: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
    return x + 1.0 / (alpha + 1e-9) * torch.sin(alpha * x) ** 2


def ref_convnext(x: torch.Tensor, sd: dict[str, torch.Tensor], p: str) -> torch.Tensor:
    h = ref_causal_conv(x, sd, p + ".dwconv.conv", groups=x.shape[1]).transpose(1, 2)
    mu, var = h.mean(-1, keepdim=True), h.var(-1, unbiased=False, keepdim=True)
    h = (h - mu) / torch.sqrt(var + 1e-6) * sd[p + ".norm.weight"] + sd[p + ".norm.bias"]
    h = h @ sd[p + ".pwconv1.weight"].T + sd[p + ".pwconv1.bias"]
    h = 0.5 * h * (1 + torch.erf(h / math.sqrt(2)))
    h = h @ sd[p + ".pwconv2.weight"].T + sd[p + ".pwconv2.bias"]
    return x + (sd[p + ".gamma"] * h).transpose(1, 2)


def ref_upsample(sd: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    for i in range(2):
        x = ref_convnext(
            ref_transposed(x, sd, f"quantizer.upsample.{i}.0.conv", 2), sd, f"quantizer.upsample.{i}.1"
        )
    return x


def ref_residual_unit(x: torch.Tensor, sd: dict[str, torch.Tensor], p: str, dil: int) -> torch.Tensor:
    h = ref_causal_conv(ref_snake(x, sd[p + ".block.0.alpha"]), sd, p + ".block.1.conv", dil=dil)
    return x + ref_causal_conv(ref_snake(h, sd[p + ".block.2.alpha"]), sd, p + ".block.3.conv")


def ref_decoder(sd: dict[str, torch.Tensor], x: torch.Tensor, strides: tuple[int, ...]) -> torch.Tensor:
    x = ref_causal_conv(x, sd, "decoder.model.0.conv")
    for i, s in enumerate(strides, start=1):
        p = f"decoder.model.{i}.block"
        x = ref_transposed(ref_snake(x, sd[p + ".0.alpha"]), sd, p + ".1.conv", s)
        for u, dil in zip((2, 3, 4), (1, 3, 9), strict=True):
            x = ref_residual_unit(x, sd, f"{p}.{u}", dil)
    n = len(strides) + 1
    x = ref_causal_conv(ref_snake(x, sd[f"decoder.model.{n}.alpha"]), sd, f"decoder.model.{n + 1}.conv")
    return torch.tanh(x).squeeze(1)


# -- tests ---------------------------------------------------------------------------------------------------
def test_codebook_sum_matches_reading(model: Audio8Codec, sd: dict[str, torch.Tensor]) -> None:
    codes = _codes(0, 30, batch=2)
    codes[0, 3:, :5] = 4095  # residual codes the talker may emit: clamped to 1023
    with torch.inference_mode():
        got = model.quantizer.codes_to_latent(codes)
    assert (got - ref_vq(sd, codes)).abs().max().item() <= TOL
    clamped = codes.clone()
    clamped[:, 1:] = clamped[:, 1:].clamp(max=1023)
    with torch.inference_mode():
        assert torch.equal(model.quantizer.codes_to_latent(clamped), got)


def test_post_module_matches_reading(model: Audio8Codec, sd: dict[str, torch.Tensor]) -> None:
    # 150 frames > the 128-frame window, so the window (not just causality) is exercised.
    x = torch.randn(2, 64, 150, generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        got = model.quantizer.post_module(x)
    want = ref_post_module(sd, x, model.config.post)
    assert (got - want).abs().max().item() <= TOL
    # Sensitivity: a full-causal (windowless) reading differs, so the window is really applied.
    windowless = replace(model.config.post, window=1000)
    assert (ref_post_module(sd, x, windowless) - got).abs().max().item() > 1e-3


def test_upsample_matches_reading(model: Audio8Codec, sd: dict[str, torch.Tensor]) -> None:
    x = torch.randn(2, 64, 20, generator=torch.Generator().manual_seed(2))
    with torch.inference_mode():
        got = x
        for conv, convnext in model.quantizer.upsample:
            got = convnext(conv(got))
    assert got.shape == (2, 64, 80)
    assert (got - ref_upsample(sd, x)).abs().max().item() <= TOL


def test_decoder_model_matches_reading(model: Audio8Codec, sd: dict[str, torch.Tensor]) -> None:
    x = torch.randn(1, 64, 24, generator=torch.Generator().manual_seed(3))
    with torch.inference_mode():
        got = model.decoder(x).squeeze(1)
    assert got.shape == (1, 24 * 512)
    assert (got - ref_decoder(sd, x, (8, 8, 4, 2))).abs().max().item() <= TOL


def test_whole_decode_matches_reading(model: Audio8Codec, sd: dict[str, torch.Tensor]) -> None:
    codes = _codes(4, 12)
    with torch.inference_mode():
        wav = model(codes)
    want = ref_decoder(
        sd, ref_upsample(sd, ref_post_module(sd, ref_vq(sd, codes), model.config.post)), (8, 8, 4, 2)
    )
    assert wav.shape == (1, 12 * SPF)
    # The random init keeps the waveform mostly out of tanh's flat ends, so differences would show.
    assert wav.std() > 0.05 and (wav.abs() > 0.99).float().mean() < 0.01
    assert (wav - want).abs().max().item() <= TOL


def test_bf16_rope_table_matters(model: Audio8Codec, sd: dict[str, torch.Tensor]) -> None:
    """The bf16 table is part of the numerics: an fp32 table moves the post-module output measurably."""
    from services.codec.models.audio8_tts import transformer

    x = torch.randn(1, 64, 140, generator=torch.Generator().manual_seed(5))
    with torch.inference_mode():
        bf16 = model.quantizer.post_module(x)
        original = transformer.rope_table

        def fp32_table(pos: torch.Tensor, head_dim: int, base: float) -> tuple[torch.Tensor, torch.Tensor]:
            ang = pos.float().unsqueeze(-1) / base ** (torch.arange(0, head_dim, 2).float() / head_dim)
            return ang.cos(), ang.sin()

        transformer.rope_table = fp32_table  # type: ignore[assignment]
        try:
            fp32 = model.quantizer.post_module(x)
        finally:
            transformer.rope_table = original
    assert (bf16 - fp32).abs().max().item() > 1e-4


def test_released_geometry_is_size_true() -> None:
    """models.md §2.5 (verified counts): post_module ~55 M, upsample ~21 M, decoder.model ~54 M; ~340 M
    for the whole codec; and the key names/shapes of the §2.5 key tree."""
    with torch.device("meta"):
        m = Audio8Codec(Audio8CodecConfig.released())

    def millions(module: torch.nn.Module) -> float:
        return sum(p.numel() for p in module.parameters()) / 1e6

    assert abs(millions(m.quantizer.post_module) - 55) < 0.5
    assert abs(millions(m.quantizer.upsample) - 21) < 0.5
    assert abs(millions(m.decoder) - 54) < 0.5
    assert abs(millions(m) - 340) < 10
    shapes = {k: tuple(v.shape) for k, v in m.state_dict().items()}
    expected = {
        "quantizer.semantic_quantizer.quantizers.0.codebook.weight": (4096, 8),
        "quantizer.semantic_quantizer.quantizers.0.in_proj.weight": (8, 1024, 1),
        "quantizer.quantizer.quantizers.8.out_proj.weight": (1024, 8, 1),
        "quantizer.quantizer.quantizers.8.codebook.weight": (1024, 8),
        "quantizer.post_module.layers.7.attention.wqkv.weight": ((16 + 2 * 8) * 64, 1024),
        "quantizer.post_module.layers.7.attention.wo.weight": (1024, 1024),
        "quantizer.post_module.layers.7.feed_forward.w1.weight": (1216, 1024),
        "quantizer.post_module.layers.0.attention_layer_scale.gamma": (1024,),
        "quantizer.post_module.norm.weight": (1024,),
        "quantizer.upsample.1.0.conv.weight": (1024, 1024, 2),
        "quantizer.upsample.1.1.dwconv.conv.weight": (1024, 1, 7),
        "quantizer.upsample.0.1.pwconv1.weight": (4096, 1024),
        "quantizer.pre_module.layers.7.feed_forward.w1.weight": (3072, 1024),
        "quantizer.downsample.1.0.conv.weight": (1024, 1024, 2),
        "decoder.model.0.conv.weight": (1536, 1024, 7),
        "decoder.model.1.block.0.alpha": (1, 1536, 1),
        "decoder.model.1.block.1.conv.weight": (1536, 768, 16),
        "decoder.model.4.block.4.block.1.conv.weight": (96, 96, 7),
        "decoder.model.5.alpha": (1, 96, 1),
        "decoder.model.6.conv.weight": (1, 96, 7),
        "encoder.block.0.conv.weight": (64, 1, 7),
        "encoder.block.1.block.0.block.1.conv.weight": (64, 64, 7),
        "encoder.block.4.block.4.conv.weight": (1024, 512, 16),
        "encoder.block.4.block.5.layers.3.attention.wqkv.weight": (3072, 1024),
        "encoder.block.6.conv.weight": (1024, 1024, 3),
    }
    for key, shape in expected.items():
        assert shapes.get(key) == shape, f"{key}: {shapes.get(key)} != {shape}"
    assert (
        "decoder.model.7.weight" not in shapes
        and "encoder.block.1.block.5.layers.0.attention.wqkv.weight" not in shapes
    )
