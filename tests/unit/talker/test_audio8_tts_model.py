"""Audio8-TTS model and config: released geometry, refusals, embeddings, compact head, cached forward."""

from __future__ import annotations

import logging

import pytest
import torch

from services.talker.models.audio8_tts.config import Audio8TalkerConfig, parse_config, parse_generation_config
from services.talker.models.audio8_tts.loader import build_model, random_init
from services.talker.models.audio8_tts.model import Audio8TTSModel, rope_table
from services.talker.models.audio8_tts.presets import preset_config
from voxstage.checkpoint import CheckpointError

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def tiny() -> Audio8TTSModel:
    return random_init(parse_config(preset_config("audio8-tts-tiny")), seed=3)


def test_released_geometry_has_0_6b_params_on_meta() -> None:
    model = build_model(Audio8TalkerConfig(), "meta", torch.bfloat16)
    params = dict(model.named_parameters())

    def total(prefix: str) -> int:
        return sum(p.numel() for n, p in params.items() if n.startswith(prefix))

    assert total("layers.") == 357_897_216  # 24 x 14.91 M (models.md estimates 357.7 M)
    assert total("embeddings.") == 139_575_296  # [155776, 896], tied with the head
    assert total("codebook_embeddings.") == 36_700_160  # [40960, 896]
    assert total("fast_layers.") == 59_644_928
    assert total("fast_embeddings.") + total("fast_output.") == 7_340_032
    n = sum(p.numel() for p in params.values())
    assert n == Audio8TalkerConfig().param_count() == 601_159_424  # ~0.60 B
    assert "fast_project_in.weight" not in params  # dim == fast_dim: absent, as released


def test_config_defaults_are_the_released_values() -> None:
    c = parse_config({})
    assert (c.vocab_size, c.dim, c.n_layer, c.n_head, c.n_local_heads, c.head_dim) == (
        155776,
        896,
        24,
        14,
        2,
        64,
    )
    assert (c.semantic_begin_id, c.semantic_end_id, c.eos_token_id, c.pad_token_id) == (
        151678, 155773, 151645, 151643,
    )  # fmt: skip
    assert (c.codebook_size, c.num_codebooks, c.max_seq_len, c.rope_base) == (4096, 10, 2048, 1e6)
    assert (c.ras_window_size, c.ras_temperature, c.ras_top_p) == (10, 1.0, 0.9)
    assert c.frame_rate_hz == pytest.approx(44100 / 2048)
    assert parse_config(c.to_dict()) == c
    g = parse_generation_config({})
    assert (g.temperature, g.top_k, g.top_p) == (0.7, 50, 0.9)


@pytest.mark.parametrize(
    "override,needle",
    [
        ({"attention_qk_norm": True}, "attention_qk_norm"),
        ({"fast_attention_qk_norm": True}, "fast_attention_qk_norm"),
        ({"attention_o_bias": True}, "attention_o_bias"),
        ({"tie_word_embeddings": False}, "tie_word_embeddings"),
        ({"scale_codebook_embeddings": True}, "scale_codebook_embeddings"),
        ({"model_type": "dual_ar"}, "model_type"),
        ({"semantic_end_id": 155000}, "semantic ids"),
        ({"eos_token_id": 151700}, "eos_token_id"),
        ({"n_local_heads": 3}, "n_local_heads"),
        ({"dim": "896"}, "field dim"),
    ],
)
def test_unsupported_configs_are_refused_naming_the_field(override: dict, needle: str) -> None:
    with pytest.raises(CheckpointError, match=needle):
        parse_config(override, source="config.json")


def test_unknown_fields_are_logged_not_fatal(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        parse_config({"some_future_flag": 1, "torch_dtype": "bfloat16"})
    assert "some_future_flag" in caplog.text and "torch_dtype" not in caplog.text


def test_dim_other_than_fast_dim_builds_fast_project_in() -> None:
    c = parse_config({**preset_config("audio8-tts-tiny"), "fast_dim": 32, "fast_head_dim": 8})
    model = build_model(c, "meta", torch.float32)
    assert model.fast_project_in.weight.shape == (32, 64)
    assert model.fast_embeddings.weight.shape == (4096, 32)


def test_rope_table_is_bf16_as_released_with_an_fp32_switch() -> None:
    c = parse_config(preset_config("audio8-tts-tiny"))
    assert build_model(c, "cpu", torch.float32).rope.dtype == torch.bfloat16
    fp32 = build_model(c, "cpu", torch.float32, rope_dtype=torch.float32)
    assert fp32.rope.dtype == torch.float32 and fp32.rope.shape == (2048, 8, 2)
    # Interleaved pairs: position p rotates pair i by p * base^(-2i/hd).
    angle = 5 * 1e6 ** (-2 * 3 / 16)
    assert fp32.rope[5, 3, 0].item() == pytest.approx(torch.cos(torch.tensor(angle)).item(), abs=1e-6)
    assert torch.equal(rope_table(2048, 16, 1e6, torch.bfloat16), fp32.rope.to(torch.bfloat16))


def test_codebook_embeddings_only_at_semantic_positions(tiny: Audio8TTSModel) -> None:
    c = tiny.config
    ids = torch.tensor([10, c.semantic_begin_id + 7, c.eos_token_id, c.semantic_end_id])
    codes = torch.randint(0, 1024, (4, 10), generator=torch.Generator().manual_seed(0))
    got = tiny.embed(ids, codes)
    tok = tiny.embeddings.weight
    books = tiny.codebook_embeddings.weight
    for i in range(4):
        want = tok[ids[i]].clone()
        if c.is_semantic(int(ids[i])):
            want += torch.stack([books[int(codes[i, k]) + 4096 * k] for k in range(10)]).sum(0)
        torch.testing.assert_close(got[i], want, rtol=0, atol=1e-6)


def test_compact_head_equals_the_tied_full_head(tiny: Audio8TTSModel) -> None:
    c = tiny.config
    h = torch.randn(3, c.dim, generator=torch.Generator().manual_seed(1))
    full = h @ tiny.embeddings.weight.T
    allowed = torch.cat(
        (torch.arange(c.semantic_begin_id, c.semantic_end_id + 1), torch.tensor([c.eos_token_id]))
    )
    torch.testing.assert_close(tiny.logits(h), full[:, allowed], rtol=1e-5, atol=1e-5)


def test_chunked_prefill_and_decode_equal_one_full_forward(tiny: Audio8TTSModel) -> None:
    """Prefill in chunks into slot 1 of a 3-slot pool, then one-token decode steps (batched with a row of
    another slot), equal the whole sequence run at once."""
    c = tiny.config
    gen = torch.Generator().manual_seed(2)
    t = 23
    ids = torch.randint(0, c.pad_token_id, (t,), generator=gen)
    ids[5:12] = c.semantic_begin_id + torch.randint(0, 4096, (7,), generator=gen)
    codes = torch.randint(0, 1024, (t, 10), generator=gen)
    x = tiny.embed(ids, codes)
    with torch.no_grad():
        full, full_res = tiny.slow(
            x.unsqueeze(0), torch.arange(t).unsqueeze(0), tiny.allocate_kv(1, 32), None, t
        )
        kv = tiny.allocate_kv(3, 32)
        other = tiny.embed(ids[:1], codes[:1])
        outs = []
        for start, end in ((0, 7), (7, 16)):
            pos = torch.arange(start, end).unsqueeze(0)
            outs.append(tiny(x[start:end].unsqueeze(0), pos, kv, torch.tensor([1]), 32)[0])
        for p in range(16, t):
            rows = torch.stack((x[p], other[0])).unsqueeze(1)
            pos = torch.tensor([[p], [0]])
            normed, res = tiny.slow(rows, pos, kv, torch.tensor([1, 2]), 32)
            outs.append(normed[0])
            torch.testing.assert_close(res[0, 0], full_res[0, p], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(torch.cat(outs), full[0], rtol=1e-5, atol=1e-5)
