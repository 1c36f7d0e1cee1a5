"""Qwen3 backbone over the caller-owned KV cache: equals a plain full-sequence implementation, chunked
prefill equals one-shot prefill, batched decode of slots with different lengths equals decoding alone, and
the interleaved MRoPE of the reference reduces to 1-D RoPE for text-only positions."""

from __future__ import annotations

import pytest
import torch

from services.talker.models.qwen3_tts.backbone import KVCache, Qwen3Backbone
from services.talker.models.qwen3_tts.config import BackboneConfig
from voxstage.nn.layers import rotate_half

CFG = BackboneConfig(
    hidden_size=32,
    intermediate_size=48,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    head_dim=16,
    rope_theta=1e6,
    rms_norm_eps=1e-6,
    max_position_embeddings=4096,
)
MROPE = (4, 2, 2)


def mrope_cos_sin(positions3: torch.Tensor, inv_freq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference's interleaved MRoPE tables from 3-axis positions [3, B, T] (written from its formula)."""
    freqs = positions3.float().unsqueeze(-1) * inv_freq  # [3, B, T, hd/2]
    mixed = freqs[0].clone()
    for axis, n in enumerate(MROPE[1:], start=1):
        mixed[..., axis : n * 3 : 3] = freqs[axis][..., axis : n * 3 : 3]
    emb = torch.cat([mixed, mixed], dim=-1)
    return emb.cos(), emb.sin()


def naive_forward(model: Qwen3Backbone, x: torch.Tensor) -> torch.Tensor:
    """Full causal attention with repeated K/V, eager softmax and MRoPE tables (three equal axes)."""
    b, t, _ = x.shape
    pos3 = torch.arange(t).expand(3, b, t)
    cos, sin = mrope_cos_sin(pos3, model.inv_freq)
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    causal = torch.full((t, t), float("-inf")).triu(1)
    rep = CFG.num_heads // CFG.num_kv_heads
    for layer in model.layers:
        a = layer.self_attn
        h = layer.input_layernorm(x)
        q = a.q_norm(a.q_proj(h).view(b, t, -1, CFG.head_dim)).transpose(1, 2)
        k = a.k_norm(a.k_proj(h).view(b, t, -1, CFG.head_dim)).transpose(1, 2)
        v = a.v_proj(h).view(b, t, -1, CFG.head_dim).transpose(1, 2)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        w = torch.softmax(q @ k.transpose(2, 3) * CFG.head_dim**-0.5 + causal, dim=-1)
        x = x + a.o_proj((w @ v).transpose(1, 2).reshape(b, t, -1))
        x = x + layer.mlp(layer.post_attention_layernorm(x))
    return model.norm(x)


@pytest.fixture(scope="module")
def model() -> Qwen3Backbone:
    torch.manual_seed(0)
    m = Qwen3Backbone(CFG).eval()
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(
                torch.randn_like(p) / p.shape[-1] ** 0.5 if p.dim() > 1 else 1 + 0.1 * torch.randn_like(p)
            )
    return m


def test_mrope_with_equal_axes_is_plain_rope(model: Qwen3Backbone) -> None:
    from voxstage.nn.layers import rope_cos_sin

    pos = torch.arange(50).unsqueeze(0)
    cos1, sin1 = rope_cos_sin(pos, model.inv_freq, torch.float32)
    cos3, sin3 = mrope_cos_sin(pos.expand(3, 1, 50), model.inv_freq)
    assert torch.equal(cos1, cos3) and torch.equal(sin1, sin3)
    # Negative control: distinct axes (vision-style positions) do change the tables.
    skew = torch.stack([pos, pos + 7, pos + 3])
    assert not torch.equal(cos1, mrope_cos_sin(skew, model.inv_freq)[0])


@torch.no_grad()
def test_prefill_matches_full_sequence_reference(model: Qwen3Backbone) -> None:
    x = torch.randn(1, 19, CFG.hidden_size)
    cache = KVCache.allocate(CFG, num_slots=2, max_len=32)
    ours = model(x, torch.arange(19).unsqueeze(0), cache, torch.tensor([1]))
    torch.testing.assert_close(ours, naive_forward(model, x), atol=1e-5, rtol=1e-5)


@torch.no_grad()
@pytest.mark.parametrize("chunk", [1, 4, 7])
def test_chunked_prefill_equals_one_shot(model: Qwen3Backbone, chunk: int) -> None:
    x = torch.randn(1, 15, CFG.hidden_size)
    whole = KVCache.allocate(CFG, 3, 24)
    ref = model(x, torch.arange(15).unsqueeze(0), whole, torch.tensor([2]))
    pieces = KVCache.allocate(CFG, 3, 24)
    outs = []
    for lo in range(0, 15, chunk):
        xs = x[:, lo : lo + chunk]
        outs.append(model(xs, torch.arange(lo, lo + xs.shape[1]).unsqueeze(0), pieces, torch.tensor([2])))
    torch.testing.assert_close(torch.cat(outs, 1), ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(pieces.k[:, 2, :, :15], whole.k[:, 2, :, :15], atol=1e-6, rtol=1e-6)


@torch.no_grad()
def test_batched_decode_with_different_lengths_equals_alone(model: Qwen3Backbone) -> None:
    lengths = {0: 5, 3: 11, 1: 2}
    prompts = {s: torch.randn(1, n, CFG.hidden_size) for s, n in lengths.items()}
    steps = torch.randn(len(lengths), 1, CFG.hidden_size)
    slots = torch.tensor(list(lengths))
    positions = torch.tensor([[n] for n in lengths.values()])

    batched = KVCache.allocate(CFG, 4, 16)
    for s, p in prompts.items():
        model(p, torch.arange(p.shape[1]).unsqueeze(0), batched, torch.tensor([s]))
    untouched = batched.k[:, 2].clone()
    out = model(steps, positions, batched, slots, attn_len=12)
    assert torch.equal(batched.k[:, 2], untouched)  # slot 2 is not in the batch

    for row, p in enumerate(prompts.values()):
        alone = KVCache.allocate(CFG, 1, 16)
        model(p, torch.arange(p.shape[1]).unsqueeze(0), alone, torch.tensor([0]))
        single = model(steps[row : row + 1], positions[row : row + 1], alone, torch.tensor([0]))
        torch.testing.assert_close(out[row], single[0], atol=1e-5, rtol=1e-5)
        full = naive_forward(model, torch.cat([p, steps[row : row + 1]], dim=1))[:, -1]
        torch.testing.assert_close(out[row, 0], full[0], atol=1e-5, rtol=1e-5)


@torch.no_grad()
def test_stale_cache_entries_are_masked(model: Qwen3Backbone) -> None:
    x = torch.randn(1, 6, CFG.hidden_size)
    clean = KVCache.allocate(CFG, 1, 10)
    dirty = KVCache.allocate(CFG, 1, 10)
    dirty.k.normal_()
    dirty.v.normal_()  # a previous occupant's leftovers: a slot is reset by restarting at position 0
    pos = torch.arange(6).unsqueeze(0)
    torch.testing.assert_close(model(x, pos, dirty, None), model(x, pos, clean, None), atol=0, rtol=0)


def test_shape_and_length_errors(model: Qwen3Backbone) -> None:
    cache = KVCache.allocate(CFG, 1, 8)
    with pytest.raises(ValueError, match="positions"):
        model(torch.zeros(1, 3, CFG.hidden_size), torch.zeros(1, 2, dtype=torch.int64), cache)
    with pytest.raises(ValueError, match="attn_len"):
        model(torch.zeros(1, 1, CFG.hidden_size), torch.zeros(1, 1, dtype=torch.int64), cache, attn_len=9)
    with pytest.raises(ValueError, match="num_slots"):
        KVCache.allocate(CFG, 0, 8)
    assert KVCache.bytes_per_token(CFG, torch.bfloat16) == 2 * 2 * 2 * 16 * 2
