"""Config parsing and checkpoint loading in the real layout: round trip, strictness, named errors."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

from services.talker.models.qwen3_tts.config import parse_config
from services.talker.models.qwen3_tts.loader import (
    load_qwen3_tts_talker,
    random_init,
    talker_checkpoint_state,
)
from services.talker.models.qwen3_tts.model import Qwen3TTSTalker
from services.talker.models.qwen3_tts.presets import preset_config, preset_generation_config
from services.talker.models.qwen3_tts.tokenizer import write_tiny_tokenizer
from voxstage.checkpoint import CheckpointError


def write_checkpoint(out: Path, model: Qwen3TTSTalker, config: dict[str, Any]) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config))
    (out / "generation_config.json").write_text(json.dumps(preset_generation_config()))
    state = talker_checkpoint_state(model)
    state["speaker_encoder.fc.weight"] = torch.zeros(2, 2)  # the codec stage's part: skipped here
    save_file({k: v.to(torch.bfloat16) for k, v in state.items()}, str(out / "model.safetensors"))
    write_tiny_tokenizer(out)
    return out


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Qwen3TTSTalker]:
    raw = preset_config("qwen3-tts-tiny", "base")
    model = random_init(parse_config(raw, preset_generation_config()), seed=3)
    with torch.no_grad():  # bf16-exact weights, so the bf16 file round-trips bit for bit
        for p in model.parameters():
            p.copy_(p.to(torch.bfloat16).float())
    return write_checkpoint(tmp_path_factory.mktemp("ckpt"), model, raw), model


def _logits(model: Qwen3TTSTalker) -> torch.Tensor:
    x = model.embed_text(torch.arange(1000, 1012))[None]
    cache = model.allocate_kv_cache(1, 16)
    with torch.no_grad():
        return model.logits(model(x, torch.arange(12)[None], cache))


def test_load_round_trip_gives_same_outputs(checkpoint: tuple[Path, Qwen3TTSTalker]) -> None:
    path, original = checkpoint
    model, config, tokenizer = load_qwen3_tts_talker(path)
    assert config.tts_model_type == "base" and config.speaker_encoder_dim == 64
    assert tokenizer.token_id("<tts_pad>") == config.tts_pad_token_id
    assert torch.equal(_logits(model), _logits(original))
    bf16, _, _ = load_qwen3_tts_talker(path, dtype=torch.bfloat16)
    assert bf16.codec_head.weight.dtype == torch.bfloat16
    torch.testing.assert_close(_logits(bf16).float(), _logits(original), atol=0.1, rtol=0.05)


def _edit_weights(src: Path, dst: Path, edit: Any) -> Path:
    dst.mkdir()
    for f in src.iterdir():
        (dst / f.name).write_bytes(f.read_bytes())
    state = load_file(str(dst / "model.safetensors"))
    edit(state)
    save_file(state, str(dst / "model.safetensors"))
    return dst


def test_renamed_key_is_named(checkpoint: tuple[Path, Qwen3TTSTalker], tmp_path: Path) -> None:
    def rename(state: dict[str, torch.Tensor]) -> None:
        state["talker.code_predictor.lm_head.3.weights"] = state.pop("talker.code_predictor.lm_head.3.weight")

    bad = _edit_weights(checkpoint[0], tmp_path / "renamed", rename)
    with pytest.raises(CheckpointError) as err:
        load_qwen3_tts_talker(bad)
    assert "talker.code_predictor.lm_head.3.weight" in str(err.value)
    assert "talker.code_predictor.lm_head.3.weights" in str(err.value)


def test_foreign_and_misshaped_keys_are_named(
    checkpoint: tuple[Path, Qwen3TTSTalker], tmp_path: Path
) -> None:
    def foreign(state: dict[str, torch.Tensor]) -> None:
        state["thinker.extra.weight"] = torch.zeros(1)

    with pytest.raises(CheckpointError, match="thinker.extra.weight"):
        load_qwen3_tts_talker(_edit_weights(checkpoint[0], tmp_path / "foreign", foreign))

    def shape(state: dict[str, torch.Tensor]) -> None:
        state["talker.codec_head.weight"] = state["talker.codec_head.weight"][:-1].clone()

    with pytest.raises(CheckpointError, match="talker.codec_head.weight"):
        load_qwen3_tts_talker(_edit_weights(checkpoint[0], tmp_path / "shape", shape))


def test_missing_generation_config_is_named(checkpoint: tuple[Path, Qwen3TTSTalker], tmp_path: Path) -> None:
    bad = _edit_weights(checkpoint[0], tmp_path / "nogen", lambda _s: None)
    (bad / "generation_config.json").unlink()
    with pytest.raises(CheckpointError, match="generation_config.json"):
        load_qwen3_tts_talker(bad)


@pytest.mark.parametrize(
    "path,value,message",
    [
        (("talker_config", "hidden_size"), None, "talker_config.hidden_size is missing"),
        (("talker_config", "num_hidden_layers"), "2", "talker_config.num_hidden_layers must be int"),
        (("talker_config", "code_predictor_config", "vocab_size"), None, "code_predictor_config.vocab_size"),
        (("talker_config", "attention_bias"), True, "talker_config.attention_bias"),
        (("talker_config", "spk_is_dialect"), {"ryan": "martian"}, "spk_is_dialect.ryan"),
        (("talker_config", "codec_bos_id"), 5000, "talker_config.codec_bos_id"),
        (("talker_config", "rope_scaling", "mrope_section"), [4, 4, 4], "mrope_section"),
        (("talker_config", "code_predictor_config", "num_code_groups"), 8, "num_code_groups"),
        (("tts_model_type",), "karaoke", "tts_model_type"),
        (("talker_config", "num_key_value_heads"), 3, "num_key_value_heads"),
    ],
)
def test_config_errors_name_the_field(path: tuple[str, ...], value: Any, message: str) -> None:
    raw = copy.deepcopy(preset_config("qwen3-tts-tiny", "custom_voice"))
    node = raw
    for key in path[:-1]:
        node = node[key]
    if value is None:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    with pytest.raises(CheckpointError, match=message.replace(".", r"\.")):
        parse_config(raw, preset_generation_config())


def test_generation_config_is_typed() -> None:
    gen = parse_config(
        preset_config("qwen3-tts-tiny", "voice_design"), {"top_k": 7, "subtalker_dosample": False}
    )
    assert (
        gen.generation.top_k == 7 and not gen.generation.subtalker_do_sample and gen.generation.top_p == 1.0
    )
    with pytest.raises(CheckpointError, match="temperature"):
        parse_config(preset_config("qwen3-tts-tiny", "voice_design"), {"temperature": "hot"})


def test_size_true_presets_have_released_parameter_counts() -> None:
    counts = {}
    for name in ("qwen3-tts-0.6b", "qwen3-tts-1.7b"):
        with torch.device("meta"):
            model = Qwen3TTSTalker(
                parse_config(preset_config(name, "custom_voice"), preset_generation_config())
            )
        counts[name] = sum(p.numel() for p in model.parameters())
    # reference-gpu.md: CustomVoice totals (no speaker encoder) of the reference build.
    assert counts == {"qwen3-tts-0.6b": 905_788_672, "qwen3-tts-1.7b": 1_916_676_352}
    with pytest.raises(ValueError, match="VoiceDesign"):
        preset_config("qwen3-tts-0.6b", "voice_design")
