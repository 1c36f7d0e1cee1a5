"""Sanity checks of the Qwen3-TTS golden fixture files themselves (not of voxstage's models)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from safetensors import safe_open

from tests.golden import (
    VARIANTS,
    expected_checkpoint_files,
    fixture_dir,
    load_cases,
    load_config,
    load_meta,
    load_state_dict,
    load_weights_manifest,
    materialize_checkpoint,
)

MAX_BYTES = 5_000_000
EOS = 2150


def _files(root: Path) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()}


def test_fixture_directory_is_under_budget() -> None:
    total = sum(p.stat().st_size for p in fixture_dir().rglob("*") if p.is_file())
    assert 0 < total < MAX_BYTES, f"fixtures take {total} bytes"


def test_npz_members_hold_no_pickles() -> None:
    for name in ("cases.npz", "weights_model.npz", "weights_speech_tokenizer.npz"):
        with np.load(fixture_dir() / name, allow_pickle=False) as data:
            assert all(data[k].dtype != object for k in data.files)


def test_weights_match_manifest_and_configs() -> None:
    manifest = load_weights_manifest()
    cfg = load_config("base")
    talker, predictor = cfg["talker_config"], cfg["talker_config"]["code_predictor_config"]
    state = load_state_dict("model", "base")
    assert tuple(state["talker.model.codec_embedding.weight"].shape) == (
        talker["vocab_size"],
        talker["hidden_size"],
    )
    assert tuple(state["talker.model.text_embedding.weight"].shape) == (
        talker["text_vocab_size"],
        talker["text_hidden_size"],
    )
    heads = talker["num_attention_heads"] * talker["head_dim"]
    assert tuple(state["talker.model.layers.0.self_attn.q_proj.weight"].shape) == (
        heads,
        talker["hidden_size"],
    )
    layers = {k.split(".")[3] for k in state if k.startswith("talker.model.layers.")}
    assert len(layers) == talker["num_hidden_layers"]
    groups = talker["num_code_groups"] - 1
    assert all(f"talker.code_predictor.lm_head.{g}.weight" in state for g in range(groups))
    assert tuple(state["talker.code_predictor.small_to_mtp_projection.weight"].shape) == (
        predictor["hidden_size"],
        talker["hidden_size"],
    )
    assert tuple(state["speaker_encoder.fc.weight"].shape)[0] == cfg["speaker_encoder_config"]["enc_dim"]
    assert sum(talker["rope_scaling"]["mrope_section"]) == talker["head_dim"] // 2
    assert set(state) == set(manifest["model"]["tensors"])
    assert all(list(state[k].shape) == info["shape"] for k, info in manifest["model"]["tensors"].items())


def test_speech_tokenizer_weights_match_config() -> None:
    cfg = load_config("speech_tokenizer")
    dec = cfg["decoder_config"]
    state = load_state_dict("speech_tokenizer")
    rest = [
        k
        for k in state
        if k.startswith("decoder.quantizer.rvq_rest.vq.layers.") and k.endswith("embedding_sum")
    ]
    assert len(rest) + 1 == dec["num_quantizers"]
    assert tuple(state["decoder.quantizer.rvq_first.vq.layers.0._codebook.embedding_sum"].shape) == (
        dec["codebook_size"],
        dec["codebook_dim"] // 2,
    )
    assert (
        np.prod(dec["upsample_rates"]) * np.prod(dec["upsampling_ratios"])
        == cfg["decode_upsample_rate"]
        == 1920
    )
    # Random codebooks (the default all-zero sums decode to silence) and non-default layer scales.
    assert state["decoder.quantizer.rvq_first.vq.layers.0._codebook.embedding_sum"].abs().sum() > 0
    assert not (state["decoder.pre_transformer.layers.0.mlp_layer_scale.scale"] == 0.01).all()
    assert state["decoder.decoder.1.block.0.alpha"].abs().sum() > 0


def test_configs_keep_real_ids() -> None:
    cv = load_config("custom_voice")
    talker = cv["talker_config"]
    assert (
        cv["tts_pad_token_id"] == 151671
        and cv["tts_bos_token_id"] == 151672
        and cv["tts_eos_token_id"] == 151673
    )
    assert talker["codec_eos_token_id"] == EOS and talker["vocab_size"] == 3072
    assert talker["spk_id"]["ryan"] == 3061 and talker["spk_is_dialect"]["eric"] == "sichuan_dialect"
    assert load_config("voice_design")["tts_model_type"] == "voice_design"
    # Qwen3TTSSpeakerEncoderConfig has no **kwargs: a model_type key there breaks the reference loader.
    assert "model_type" not in cv["speaker_encoder_config"]


def test_cases_are_consistent_with_configs() -> None:
    cases = load_cases()
    meta = load_meta()
    hidden = load_config("base")["talker_config"]["hidden_size"]
    gens = {n: c for n, c in cases.items() if c["kind"] == "generate"}
    assert len(gens) >= 5
    for name, case in gens.items():
        codes = case["codes"]
        assert codes.ndim == 2 and codes.shape[1] == 16, name
        assert codes.shape[0] == case["num_frames"] >= 20, name
        assert codes.min() >= 0 and codes.max() < 2048, name
        assert case["prefill_embeds"].shape == (case["prefill_length"], hidden), name
        assert case["talker_hidden"].shape == (case["num_frames"], hidden), name
        # One group-0 token more is sampled than frames are returned (EOS, or the max_new_tokens-th token).
        assert case["sampled_group0"].shape[0] == case["num_frames"] + 1, name
        assert np.array_equal(case["sampled_group0"][:-1], codes[:, 0]), name
        assert case["stopped_on_eos"] == (case["sampled_group0"][-1] == EOS), name
        assert min(case["min_greedy_margin"].values()) >= meta["min_greedy_margin"], name
    assert any(c["stopped_on_eos"] for c in gens.values())
    logits = cases["talker_logits"]
    assert logits["logits"].shape == (logits["prefill_embeds"].shape[0], 3072)
    assert np.array_equal(logits["logits"][-1], logits["logits_last"])
    icl = cases["gen_base_icl"]
    assert np.array_equal(icl["ref_code"].T, cases["tokenizer_encode"]["codes"])
    assert np.array_equal(icl["x_vector"], cases["speaker_encoder"]["x_vector"])
    for frames in (36, 96):
        dec = cases[f"codec_decode_{frames}"]
        assert dec["codes"].shape == (16, frames) and dec["wav"].shape == (frames * 1920,)
    enc = cases["tokenizer_encode"]
    assert enc["codes"].shape == (16, -(-enc["wav"].shape[0] // 1920))
    assert enc["min_nearest_centroid_gap"] >= meta["min_nearest_centroid_gap"]
    assert np.array_equal(enc["wav"], cases["speaker_encoder"]["wav"])
    spk = cases["speaker_encoder"]
    assert spk["mel"].shape == ((spk["wav"].shape[0] + 768 - 1024) // 256 + 1, 128)


@pytest.mark.parametrize("variant", VARIANTS)
def test_materialized_checkpoint_layout(variant: str, tmp_path: Path) -> None:
    out = materialize_checkpoint(variant, tmp_path / variant)
    files = _files(out)
    try:
        import services.talker.models.qwen3_tts.tokenizer as tok

        with_tokenizer = hasattr(tok, "write_tiny_tokenizer")
    except ImportError:
        with_tokenizer = False
    assert files == expected_checkpoint_files(with_tokenizer)
    manifest = load_weights_manifest()
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
        assert f.metadata() == {"format": "pt"}
    assert keys == set(manifest["model"]["variants"][variant])
    assert any(k.startswith("speaker_encoder.") for k in keys) == (variant == "base")
    with safe_open(str(out / "speech_tokenizer" / "model.safetensors"), "pt") as f:
        assert set(f.keys()) == set(manifest["speech_tokenizer"]["tensors"])
    config = json.loads((out / "config.json").read_text())
    assert config["tts_model_type"] == variant and config["model_type"] == "qwen3_tts"


def test_bfloat16_checkpoint_is_exact(tmp_path: Path) -> None:
    out = materialize_checkpoint("custom_voice", tmp_path, dtype="bfloat16")
    expected = load_state_dict("model", "custom_voice")
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        for key in ("talker.codec_head.weight", "talker.model.layers.0.self_attn.q_proj.weight"):
            stored = f.get_tensor(key)
            assert str(stored.dtype) == "torch.bfloat16"
            assert (stored.float() == expected[key]).all()
