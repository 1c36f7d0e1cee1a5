"""Qwen3-TTS codec layers: SnakeBeta's cached scales and the quantizer's stacked codebook table give the
per-call formulas' output and follow the weights when they change; the window attention's one q/k/v GEMM
gives the separate projections' output."""

from __future__ import annotations

import torch

from services.codec.models import load_codec
from services.codec.models.qwen3_tts.decoder import Qwen3TokenizerDecoder, SplitResidualVQ
from services.codec.models.qwen3_tts.layers import SnakeBeta, WindowAttention
from services.codec.models.qwen3_tts.loader import random_init
from services.codec.models.qwen3_tts.presets import decoder_preset
from voxstage.presets import resolve_model


def formula(act: SnakeBeta, x: torch.Tensor) -> torch.Tensor:
    """The reference expression, evaluated afresh (what every call computed before the cache)."""
    wide = torch.promote_types(x.dtype, torch.float32)
    alpha = act.alpha.to(wide).exp()[None, :, None]
    beta = act.beta.to(wide).exp()[None, :, None]
    xw = x.to(wide)
    return (xw + (1.0 / (beta + 1e-9)) * torch.sin(xw * alpha).pow(2)).to(x.dtype)


@torch.inference_mode()
def test_cached_scales_equal_the_formula_and_follow_new_weights() -> None:
    gen = torch.Generator().manual_seed(0)
    act = SnakeBeta(8).requires_grad_(False)
    x = torch.randn(3, 8, 50, generator=gen) * 4
    for dtype in (torch.float32, torch.bfloat16, torch.float64):
        assert torch.equal(act(x.to(dtype)), formula(act, x.to(dtype)))
    before = act(x)
    # In place, as load_state_dict writes weights: the cache must notice.
    act.load_state_dict({"alpha": torch.randn(8, generator=gen), "beta": torch.randn(8, generator=gen)})
    after = act(x)
    assert not torch.equal(after, before)
    assert torch.equal(after, formula(act, x))
    act.to(torch.float64)  # new parameter tensors
    assert torch.equal(act(x.double()), formula(act, x.double()))


def test_training_keeps_gradients_to_the_parameters() -> None:
    act = SnakeBeta(4)
    act(torch.randn(2, 4, 10)).sum().backward()
    assert act.alpha.grad is not None and act.beta.grad is not None
    assert act.beta.grad.abs().sum() > 0


def per_codebook(q: SplitResidualVQ, codes: torch.Tensor) -> torch.Tensor:
    """The lookup as every call ran it before the table: each codebook gathered and divided, then summed."""
    return q.rvq_first.decode(codes[:, :1]) + q.rvq_rest.decode(codes[:, 1:])


def test_the_stacked_codebook_table_gives_the_per_codebook_lookup_and_follows_new_weights() -> None:
    cfg = decoder_preset("qwen3-tts-tiny")
    q = random_init(cfg, 0).quantizer  # built outside inference mode, as the stage loads it
    gen = torch.Generator().manual_seed(1)
    codes = torch.randint(0, cfg.codebook_size, (3, cfg.num_quantizers, 7), generator=gen)
    with torch.inference_mode():
        torch.testing.assert_close(q.decode(codes), per_codebook(q, codes), rtol=0, atol=1e-6)
        table = q.table()
        assert table is not None and q.table() is table  # kept between calls
        before = q.decode(codes)
    state = {k: v.clone() for k, v in q.state_dict().items()}
    state["rvq_rest.vq.layers.3._codebook.cluster_usage"] *= 2
    q.load_state_dict(state)  # in place, as a checkpoint load writes weights: the table must notice
    with torch.inference_mode():
        assert q.table() is not table
        after = q.decode(codes)
        assert not torch.equal(after, before)
        torch.testing.assert_close(after, per_codebook(q, codes), rtol=0, atol=1e-6)


def test_weights_without_a_version_take_the_per_codebook_lookup() -> None:
    cfg = decoder_preset("qwen3-tts-tiny")
    with torch.inference_mode():
        q = random_init(cfg, 0).quantizer  # inference tensors: no version counter, so no safe cache key
        codes = torch.randint(0, cfg.codebook_size, (2, cfg.num_quantizers, 4))
        assert q.table() is None
        assert torch.equal(q.decode(codes), per_codebook(q, codes))


@torch.inference_mode()
def test_one_qkv_gemm_gives_the_separate_projections_output() -> None:
    cfg = decoder_preset("qwen3-tts-tiny")
    decoder = random_init(cfg, 0)  # placed, so its attentions run the fused projection
    attn = decoder.pre_transformer.layers[0].self_attn
    assert isinstance(attn, WindowAttention) and attn._qkv is not None and attn._qkv.weight() is not None
    gen = torch.Generator().manual_seed(2)
    codes = torch.randint(0, cfg.codebook_size, (2, cfg.num_quantizers, 5), generator=gen)
    fused_out = decoder(codes)
    attns = [layer.self_attn for layer in decoder.pre_transformer.layers]
    kept = [a._qkv for a in attns]
    for a in attns:
        a._qkv = None  # the separate projections
    try:
        torch.testing.assert_close(decoder(codes), fused_out, rtol=0, atol=1e-6)
    finally:
        for a, k in zip(attns, kept, strict=True):
            a._qkv = k


def test_the_codec_stage_loads_a_decoder_that_keeps_its_tables() -> None:
    """The stage's load (``load_codec``) leaves weights with version counters and the q/k/v views intact, so
    its decodes take the stacked codebook table and the one q/k/v GEMM (a load under inference mode would
    silently fall back to the per-codebook lookup)."""
    runtime = load_codec(resolve_model("qwen3-tts-tiny"), device="cpu", dtype=torch.float32, max_streams=2)
    decoder = runtime.decoder.model
    assert isinstance(decoder, Qwen3TokenizerDecoder)
    with torch.inference_mode():
        assert decoder.quantizer.table() is not None
    for layer in decoder.pre_transformer.layers:
        assert layer.self_attn._qkv is not None and layer.self_attn._qkv.weight() is not None
