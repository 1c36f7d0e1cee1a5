"""Loading PersonaPlex from a directory laid out like the released one; strict keys; config rules."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from services.talker.models.personaplex.config import parse_lm_config
from services.talker.models.personaplex.loader import build_model, load_personaplex_lm, save_checkpoint
from services.talker.models.personaplex.model import PersonaPlexLM
from services.talker.models.personaplex.tokenizer import PersonaTokenizer, tiny_tokenizer_model, wrap_system
from services.talker.models.personaplex.voices import parse_voice, voice_from_codes
from tests.golden_personaplex import fixture_model, load_case
from voxstage.checkpoint import CheckpointError


@pytest.fixture(scope="module")
def case() -> dict:
    return load_case("prompt_voice")


@pytest.fixture(scope="module")
def model(case: dict) -> PersonaPlexLM:
    return fixture_model(case)


def _write(tmp: Path, model: PersonaPlexLM, case: dict) -> Path:
    voice = voice_from_codes(model, case["voice"])
    kwargs = dict(case["lm_kwargs"])
    save_checkpoint(
        tmp,
        model,
        kwargs,
        tokenizer_model=tiny_tokenizer_model(),
        voices={"NATF0": voice},
        dtype=torch.float32,
    )
    return tmp


def test_a_released_layout_loads_with_its_weights_tokenizer_and_voices(tmp_path: Path, model, case) -> None:
    root = _write(tmp_path, model, case)
    loaded, tokenizer, voices = load_personaplex_lm(root)
    for (k, a), (_, b) in zip(model.state_dict().items(), loaded.state_dict().items(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=k)
    assert voices.names == ("NATF0",)
    voice = voices.get("NATF0", model.config.dim, model.config.num_codebooks)
    assert voice.embeddings.shape == (len(case["voice"]) - 1, model.config.dim)
    ids = tokenizer.encode_persona("You enjoy having a good conversation.")
    assert ids and max(ids) < tokenizer.vocab_size <= model.config.text_card


def test_voices_also_load_from_the_released_archive(tmp_path: Path, model, case) -> None:
    root = _write(tmp_path, model, case)
    with tarfile.open(root / "voices.tgz", "w:gz") as tar:
        tar.add(root / "voices" / "NATF0.pt", arcname="voices/NATF0.pt")
    (root / "voices" / "NATF0.pt").unlink()
    (root / "voices").rmdir()
    _, _, voices = load_personaplex_lm(root)
    assert voices.names == ("NATF0",)
    assert voices.get("NATF0", model.config.dim, model.config.num_codebooks).cache.shape == (17, 4)


def test_a_wrong_key_fails_naming_it(tmp_path: Path, model, case) -> None:
    root = _write(tmp_path, model, case)
    state = load_file(str(root / "model.safetensors"))
    state["transformer.layers.1.norm1.scale"] = state.pop("transformer.layers.1.norm1.alpha")
    save_file(state, str(root / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"transformer\.layers\.1\.norm1\.(alpha|scale)") as err:
        load_personaplex_lm(root)
    assert "missing keys: transformer.layers.1.norm1.alpha" in str(err.value)
    assert "unexpected keys: transformer.layers.1.norm1.scale" in str(err.value)


def test_a_dep_q_16_checkpoint_loads_its_agent_steps(tmp_path: Path, model, case) -> None:
    """The reference loader's expanded depformer (16 step sets: the user stream's copies of the agent's)."""
    root = _write(tmp_path, model, case)
    state = load_file(str(root / "model.safetensors"))
    d = model.config.depformer_dim
    for key in list(state):
        for prefix, n in (("depformer_in.", 8), ("linears.", 8), ("depformer_emb.", 7)):
            if key.startswith(prefix):
                i = int(key.split(".")[1])
                state[f"{prefix}{i + n}.weight"] = state[key] + 1.0  # must be dropped, not used
        parts = key.split(".")
        if parts[0] == "depformer" and parts[3] == "gating":  # depformer.layers.N.gating.STEP.linear_*
            parts[4] = str(int(parts[4]) + 8)
            state[".".join(parts)] = state[key] + 1.0
    for i in range(model.config.depformer_num_layers):
        for name, rows in (("in_proj_weight", 3 * d), ("out_proj.weight", d)):
            key = f"depformer.layers.{i}.self_attn.{name}"
            state[key] = torch.cat([state[key], state[key] + 1.0])
            assert state[key].shape[0] == 16 * rows
    save_file(state, str(root / "model.safetensors"))
    config = json.loads((root / "config.json").read_text()) | {"dep_q": 16}
    (root / "config.json").write_text(json.dumps(config))
    loaded, _, _ = load_personaplex_lm(root)
    for (k, a), (_, b) in zip(model.state_dict().items(), loaded.state_dict().items(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=k)


def test_config_rules() -> None:
    released = parse_lm_config({})  # PersonaPlex ships an empty config.json: the 7B
    assert (released.dim, released.num_layers, released.context, released.steps) == (4096, 32, 3000, 8)
    assert sum(p.numel() for p in build_model(released, "meta", torch.bfloat16).parameters()) == 7_687_729_152
    assert released.param_count() == 7_687_729_152
    with pytest.raises(CheckpointError, match="conditioners"):
        parse_lm_config({"conditioners": {}})
    with pytest.raises(CheckpointError, match="norm='layer_norm'"):
        parse_lm_config({"norm": "layer_norm"})
    with pytest.raises(CheckpointError, match="delays"):
        parse_lm_config({"delays": [0] * 17})
    with pytest.raises(CheckpointError, match="model_type"):
        parse_lm_config({"model_type": "hibiki"})


def test_tokenizer_wraps_the_persona_and_reads_text_tokens() -> None:
    tok = PersonaTokenizer(tiny_tokenizer_model())
    assert tiny_tokenizer_model() == tiny_tokenizer_model()  # deterministic preset files
    assert wrap_system("  Be nice. ") == "<system> Be nice. <system>"
    assert wrap_system("<system> Be nice. <system>") == "<system> Be nice. <system>"
    ids = tok.encode_persona("Hello there")
    assert "".join(tok.piece(i) for i in ids).strip().replace("  ", " ").startswith("<system> Hello")
    assert tok.piece(3) == "" and tok.piece(0) == "" and tok.piece(10_000) == ""
    with pytest.raises(CheckpointError, match="SentencePiece"):
        PersonaTokenizer(b"not a model")


def test_a_bad_voice_file_is_refused(tmp_path: Path) -> None:
    torch.save({"embeddings": torch.zeros(3, 1, 1, 64)}, tmp_path / "v.pt")
    with pytest.raises(CheckpointError, match="'embeddings' and 'cache'"):
        parse_voice((tmp_path / "v.pt").read_bytes(), dim=64, rows=17, source="v")
    torch.save({"embeddings": torch.zeros(3, 1, 1, 32), "cache": torch.zeros(1, 17, 4)}, tmp_path / "w.pt")
    with pytest.raises(CheckpointError, match="dimension 64"):
        parse_voice((tmp_path / "w.pt").read_bytes(), dim=64, rows=17, source="w")
    with pytest.raises(CheckpointError, match="not a readable voice file"):
        parse_voice(b"garbage", dim=64, rows=17, source="x")
    ok = {"embeddings": torch.zeros(3, 1, 1, 64), "cache": torch.zeros(1, 17, 4, dtype=torch.int64)}
    torch.save(ok, tmp_path / "ok.pt")
    voice = parse_voice((tmp_path / "ok.pt").read_bytes(), dim=64, rows=17, source="ok")
    assert voice.embeddings.shape == (3, 64) and np.array_equal(voice.cache, np.zeros((17, 4)))
