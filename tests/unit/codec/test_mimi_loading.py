"""Mimi config parsing, module tree vs the kyutai checkpoint layout, strict loading and seeded weights."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from services.codec.models.mimi.config import MimiConfig
from services.codec.models.mimi.loader import (
    MimiCheckpointError,
    find_mimi_weights,
    load_mimi,
    mimi_checkpoint_state,
    random_init,
    write_mimi_checkpoint,
)
from services.codec.models.mimi.model import MimiModel
from services.codec.models.mimi.presets import MIMI_PRESETS, mimi_config_dict, mimi_preset, tiny_config
from services.codec.models.mimi.quantizer import CODEBOOK_EPS
from tests import golden_personaplex_mimi as golden
from voxstage.checkpoint import CheckpointError


def _meta_model(config: MimiConfig) -> MimiModel:
    with torch.device("meta"):
        return MimiModel(config)


def _count(*modules: torch.nn.Module) -> int:
    return sum(p.numel() for m in modules for p in m.parameters())


# -- config ---------------------------------------------------------------------------------------------
def test_defaults_are_the_released_config() -> None:
    cfg = MimiConfig.from_dict({})
    assert cfg == MimiConfig() == mimi_preset("personaplex-7b")
    assert (cfg.sample_rate, cfg.frame_rate, cfg.samples_per_frame, cfg.hop_length) == (
        24000,
        12.5,
        1920,
        1920,
    )
    assert (cfg.encoder_hop_length, cfg.encoder_frame_rate, cfg.steps_per_frame) == (960, 25.0, 2)
    assert cfg.seanet.ratios == (8, 6, 5, 4) and cfg.transformer.context == 250
    assert (cfg.quantizer.n_q, cfg.quantizer.bins, cfg.num_codebooks) == (32, 2048, 8)
    # moshi's json shape round-trips (num_codebooks is not part of it).
    assert MimiConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg
    assert "num_codebooks" not in cfg.to_dict()


def test_partial_overrides() -> None:
    cfg = MimiConfig.from_dict({"transformer": {"context": 40, "layer_scale": None}, "num_codebooks": 4})
    assert cfg.transformer.context == 40 and cfg.transformer.layer_scale is None
    assert cfg.transformer.d_model == 512 and cfg.num_codebooks == 4
    assert tiny_config().seanet.dimension == 32 and tiny_config().quantizer.n_q == 32
    assert set(MIMI_PRESETS) == {"personaplex-tiny", "personaplex-7b"}
    assert mimi_config_dict("personaplex-7b") == MimiConfig().to_dict()


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"transformer": {"contxt": 250}}, "unknown key mimi_config.transformer.contxt"),
        ({"codec": {}}, "unknown key mimi_config.codec"),
        ({"seanet": {"n_filters": "64"}}, "mimi_config.seanet.n_filters must be an integer"),
        ({"seanet": {"n_filters": True}}, "mimi_config.seanet.n_filters must be an integer"),
        ({"seanet": {"ratios": [8, 6.0, 5, 4]}}, "mimi_config.seanet.ratios must be a list of integers"),
        ({"frame_rate": "12.5"}, "mimi_config.frame_rate must be a finite number"),
        ({"transformer": {"causal": 1}}, "mimi_config.transformer.causal must be a boolean"),
        ({"seanet": []}, "mimi_config.seanet must be a JSON object"),
        ({"seanet": {"norm": "weight_norm"}}, "mimi_config.seanet.norm must be 'none'"),
        ({"transformer": {"gating": "silu"}}, "mimi_config.transformer.gating must be 'none'"),
        ({"transformer": {"num_heads": 3}}, "d_model"),
        ({"quantizer": {"input_dimension": 256}}, "mimi_config.quantizer: input_dimension"),
        ({"num_codebooks": 33}, "num_codebooks"),
        ({"frame_rate": 12.0}, "integer multiple of the SEANet"),
    ],
)
def test_bad_configs_name_the_key(data: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        MimiConfig.from_dict(data)


# -- module tree ------------------------------------------------------------------------------------------
def test_released_size_matches_moshi_keys_and_models_md_counts() -> None:
    model = _meta_model(MimiConfig())
    ours = {k: list(v.shape) for k, v in model.state_dict().items()}
    moshi = json.loads((golden.fixture_dir() / "full_size_keys.json").read_text())
    assert ours == moshi
    # models.md §3.2: 79.3 M in total, 40.4 M on the decode side (the decoder, its transformer, the
    # upsampler and the quantizer's projections; codebooks are buffers, as in moshi, and not counted).
    assert _count(model) == 79_308_609
    decode_side = _count(model.decoder, model.decoder_transformer, model.upsample, model.quantizer)
    assert decode_side == 40_441_377
    assert round(_count(model) / 1e6, 1) == 79.3 and round(decode_side / 1e6, 1) == 40.4
    buffers = sum(b.numel() for name, b in model.named_buffers() if "_codebook" in name)
    assert buffers == 32 * (2048 * 256 + 2048 + 1)


def test_tiny_matches_moshi_keys() -> None:
    ours = {k: list(v.shape) for k, v in _meta_model(tiny_config()).state_dict().items()}
    moshi = {
        k: info["shape"]
        for k, info in json.loads((golden.fixture_dir() / "weights.json").read_text()).items()
    }
    # Same keys and shapes (order differs: moshi's fused projections live in child modules).
    assert ours == moshi


# -- loading ----------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny() -> MimiModel:
    return random_init(tiny_config().with_overrides({"transformer": {"context": 16}}), seed=9)


def test_written_checkpoint_loads_back(tiny: MimiModel, tmp_path: Path) -> None:
    path = write_mimi_checkpoint(tiny, tmp_path, name="tokenizer-test.safetensors")
    assert path == find_mimi_weights(tmp_path)
    loaded = load_mimi(tmp_path)  # config from mimi_config.json (context 16, not the released 250)
    assert loaded.config == tiny.config
    for key, value in tiny.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], value), key
    codes = torch.randint(0, 2048, (1, 8, 6), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        assert torch.equal(loaded.decode(codes), tiny.decode(codes))
    assert torch.equal(loaded.quantizer.codebooks, tiny.quantizer.codebooks)
    # A file path works too, and an explicit config wins over the directory's json.
    assert load_mimi(path, config=tiny.config).config == tiny.config


def test_bfloat16_load_keeps_the_quantizer_fp32(tiny: MimiModel, tmp_path: Path) -> None:
    write_mimi_checkpoint(tiny, tmp_path)
    loaded = load_mimi(tmp_path, dtype=torch.bfloat16)
    assert loaded.compute_dtype == torch.bfloat16
    assert loaded.decoder_transformer.transformer.layers[0].self_attn.in_proj_weight.dtype == torch.bfloat16
    assert all(t.dtype == torch.float32 for t in loaded.quantizer.state_dict().values())
    assert torch.equal(loaded.quantizer.codebooks, tiny.quantizer.codebooks)


def _broken_checkpoint(tiny: MimiModel, tmp_path: Path, edit: str) -> Path:
    state = mimi_checkpoint_state(tiny)
    if edit == "missing":
        del state["decoder_transformer.transformer.layers.1.norm2.bias"]
    elif edit == "renamed":
        state["upsample.convtr.convtr.weight"] = state.pop("upsample.convtr.convtr.convtr.weight")
    elif edit == "shape":
        state["quantizer.rvq_rest.output_proj.weight"] = torch.zeros(32, 16, 3)
    save_file(state, str(tmp_path / "tokenizer-broken.safetensors"))
    (tmp_path / "mimi_config.json").write_text(json.dumps(tiny.config.to_dict()))
    return tmp_path


@pytest.mark.parametrize(
    ("edit", "names"),
    [
        ("missing", ["missing keys: decoder_transformer.transformer.layers.1.norm2.bias"]),
        (
            "renamed",
            ["missing keys: upsample.convtr.convtr.convtr.weight", "unexpected keys: upsample.convtr."],
        ),
        ("shape", ["quantizer.rvq_rest.output_proj.weight: checkpoint (32, 16, 3) vs model (32, 16, 1)"]),
    ],
)
def test_key_mismatch_fails_naming_the_keys(
    tiny: MimiModel, tmp_path: Path, edit: str, names: list[str]
) -> None:
    folder = _broken_checkpoint(tiny, tmp_path, edit)
    with pytest.raises(MimiCheckpointError) as info:
        load_mimi(folder)
    assert isinstance(info.value, CheckpointError)
    for name in names:
        assert name in str(info.value)


def test_directory_must_hold_exactly_one_tokenizer_file(tiny: MimiModel, tmp_path: Path) -> None:
    with pytest.raises(MimiCheckpointError, match=f"{tmp_path} must hold exactly one .* found none"):
        load_mimi(tmp_path)
    write_mimi_checkpoint(tiny, tmp_path, name="tokenizer-a.safetensors")
    write_mimi_checkpoint(tiny, tmp_path, name="tokenizer-b.safetensors")
    with pytest.raises(MimiCheckpointError, match="tokenizer-a.safetensors, tokenizer-b.safetensors"):
        load_mimi(tmp_path)
    with pytest.raises(MimiCheckpointError, match="neither a file nor a directory"):
        load_mimi(tmp_path / "absent")
    (tmp_path / "tokenizer-a.safetensors").unlink()
    (tmp_path / "mimi_config.json").write_text(json.dumps({"seanet": {"dimenson": 32}}))
    with pytest.raises(MimiCheckpointError, match="unknown key mimi_config.seanet.dimenson"):
        load_mimi(tmp_path)


def test_codebooks_are_sum_over_clamped_usage(tiny: MimiModel) -> None:
    state = mimi_checkpoint_state(tiny)
    usage_key = "quantizer.rvq_rest.vq.layers.2._codebook.cluster_usage"
    sum_key = "quantizer.rvq_rest.vq.layers.2._codebook.embedding_sum"
    state[usage_key][5] = 0.0  # a dead entry: moshi clamps the usage to 1e-5 instead of dividing by 0
    state[usage_key][6] = 2.5
    model = MimiModel(tiny.config)
    model.load_state_dict(state)  # the post-load hook refreshes the table
    table = model.quantizer.codebooks[3]  # global codebook 3 = acoustic layer 2
    assert torch.equal(table[5], state[sum_key][5] / CODEBOOK_EPS)
    assert torch.equal(table[6], state[sum_key][6] / 2.5)
    assert model.quantizer.codebooks.shape == (8, 2048, 16)


def test_random_init_is_seeded(tiny: MimiModel) -> None:
    again = random_init(tiny.config, seed=9)
    other = random_init(tiny.config, seed=10)
    assert all(
        torch.equal(a, b)
        for a, b in zip(tiny.state_dict().values(), again.state_dict().values(), strict=True)
    )
    assert not torch.equal(tiny.encoder.model[0].conv.conv.weight, other.encoder.model[0].conv.conv.weight)
    assert all(bool(t.eq(1).all()) for k, t in tiny.state_dict().items() if k.endswith("_initialized"))


def test_checkpoint_state_is_kyutai_layout(tiny: MimiModel, tmp_path: Path) -> None:
    path = write_mimi_checkpoint(tiny, tmp_path)
    stored = load_file(str(path))
    assert set(stored) == set(tiny.state_dict())
    assert "decoder_transformer.transformer.layers.0.self_attn.in_proj_weight" in stored
    assert "quantizer.rvq_first.vq.layers.0._codebook.embedding_sum" in stored
    assert "quantizer.codebooks" not in stored  # derived, recomputed at load
    assert all(t.dtype == torch.float32 and t.is_contiguous() for t in stored.values())
    with pytest.raises(ValueError, match="tokenizer-"):
        write_mimi_checkpoint(tiny, tmp_path, name="mimi.safetensors")
