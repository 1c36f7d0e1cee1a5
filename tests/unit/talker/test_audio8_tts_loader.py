"""Audio8-TTS checkpoints: strict loading of the released flat layout, errors naming keys, presets."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from services.talker.models import load_talker
from services.talker.models.audio8_tts.adapter import Audio8TTSAdapter
from services.talker.models.audio8_tts.config import parse_config
from services.talker.models.audio8_tts.loader import load_audio8_talker, random_init, save_checkpoint
from services.talker.models.audio8_tts.presets import preset_config, write_preset
from voxstage.checkpoint import CheckpointError
from voxstage.presets import ModelSource

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny checkpoint written in the released layout, bf16 weights as released."""
    out = tmp_path_factory.mktemp("audio8_ckpt")
    raw = preset_config("audio8-tts-tiny")
    save_checkpoint(out, random_init(parse_config(raw), seed=5), raw)
    return out


def _rewrite(src: Path, dst: Path, edit: dict[str, torch.Tensor | None]) -> Path:
    dst.mkdir(parents=True, exist_ok=True)
    (dst / "config.json").write_text((src / "config.json").read_text())
    state = load_file(str(src / "model.safetensors"))
    for key, value in edit.items():
        if value is None:
            state.pop(key)
        else:
            state[key] = value
    save_file(state, str(dst / "model.safetensors"))
    return dst


def test_released_flat_layout_loads_strictly(checkpoint: Path) -> None:
    keys = set(load_file(str(checkpoint / "model.safetensors")))
    assert {"embeddings.weight", "codebook_embeddings.weight", "norm.weight", "fast_norm.weight"} <= keys
    assert {
        "layers.1.attention.wqkv.bias",
        "fast_output.weight",
        "fast_layers.0.feed_forward.w3.weight",
    } <= keys
    assert "fast_layers.0.attention.wqkv.bias" not in keys and "fast_project_in.weight" not in keys
    model, config, tokenizer = load_audio8_talker(checkpoint, dtype=torch.float32)
    assert tokenizer is None  # no tokenizer.json in this directory
    assert config == parse_config(preset_config("audio8-tts-tiny"))
    want = random_init(config, seed=5)
    for name, value in want.state_dict().items():
        assert torch.equal(model.state_dict()[name], value.to(torch.bfloat16).float()), name
    # The compact head was sliced from the loaded weights.
    assert torch.equal(model.head_weight[-1], model.embeddings.weight[config.eos_token_id])
    # The fused [w1 | w3] views survived the in-place load.
    assert model.layers[0].feed_forward._w13.weight() is not None


def test_missing_and_unexpected_keys_are_named(checkpoint: Path, tmp_path: Path) -> None:
    missing = _rewrite(checkpoint, tmp_path / "missing", {"layers.1.attention.wqkv.bias": None})
    with pytest.raises(CheckpointError, match=r"missing keys: layers\.1\.attention\.wqkv\.bias"):
        load_audio8_talker(missing)
    extra = _rewrite(checkpoint, tmp_path / "extra", {"output.weight": torch.zeros(4, 64)})
    with pytest.raises(CheckpointError, match=r"unexpected keys: output\.weight"):
        load_audio8_talker(extra)
    shape = _rewrite(checkpoint, tmp_path / "shape", {"fast_output.weight": torch.zeros(1024, 64)})
    with pytest.raises(CheckpointError, match=r"fast_output\.weight: checkpoint \(1024, 64\)"):
        load_audio8_talker(shape)


def test_rotary_buffers_in_a_checkpoint_are_skipped(checkpoint: Path, tmp_path: Path) -> None:
    extra = {"freqs_cis": torch.zeros(2048, 8, 2), "fast_freqs_cis": torch.zeros(10, 8, 2)}
    model, _, _ = load_audio8_talker(_rewrite(checkpoint, tmp_path / "freqs", extra))  # type: ignore[arg-type]
    assert "freqs_cis" not in model.state_dict()


def test_fast_project_in_is_required_when_dim_differs(checkpoint: Path, tmp_path: Path) -> None:
    out = _rewrite(checkpoint, tmp_path / "proj", {})
    config = json.loads((out / "config.json").read_text())
    config.update(fast_dim=32, fast_head_dim=8)
    (out / "config.json").write_text(json.dumps(config))
    with pytest.raises(
        CheckpointError, match=r"missing keys: fast_project_in\.bias, fast_project_in\.weight"
    ):
        load_audio8_talker(out)


def test_random_init_is_seeded() -> None:
    c = parse_config(preset_config("audio8-tts-tiny"))
    a, b, other = random_init(c, seed=1), random_init(c, seed=1), random_init(c, seed=2)
    assert torch.equal(a.layers[0].attention.wqkv.weight, b.layers[0].attention.wqkv.weight)
    assert not torch.equal(a.layers[0].attention.wqkv.weight, other.layers[0].attention.wqkv.weight)
    assert torch.equal(a.layers[0].attention.wqkv.bias, torch.zeros_like(a.layers[0].attention.wqkv.bias))


def test_presets_load_through_load_talker(tmp_path: Path) -> None:
    assert write_preset("audio8-tts-tiny", tmp_path / "tiny") is False
    adapter, info = load_talker(ModelSource("audio8-tts-tiny", tmp_path / "tiny", "arktts"))
    assert isinstance(adapter, Audio8TTSAdapter) and adapter.tokenizer is not None
    assert (info.family, info.num_code_groups, info.variant, info.max_new_frames) == (
        "audio8_tts",
        10,
        "plain",
        2048,
    )
    assert info.frame_rate_hz == pytest.approx(21.533, abs=1e-3)
    assert info.voices == ("default",) and info.languages == ("auto",)
    s = info.default_sampling
    assert (s.temperature, s.top_k, s.top_p) == (0.7, 50, 0.9) and info.default_subtalker_sampling == s
    # The size-true preset writes no weights; its config is the released one.
    assert write_preset("audio8-tts-0.6b", tmp_path / "big") is True
    assert not (tmp_path / "big" / "model.safetensors").exists()
    assert parse_config(json.loads((tmp_path / "big" / "config.json").read_text())) == parse_config({})
