"""Qwen3-TTS reference-audio encoders: the 12 Hz tokenizer encoder and the speaker encoder.

Structural tests run on seeded tiny models; the golden tests compare against the reference outputs in
``tests/fixtures/qwen3_tts`` (qwen-tts 0.1.1 under transformers 4.57.3).
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from services.codec.models.qwen3_tts.encoder import (
    EncoderConfig,
    load_qwen3_tts_encoder,
    random_init_encoder,
    real_encoder_config,
    tiny_encoder_config,
)
from services.codec.models.qwen3_tts.encoder_quantizer import unused_quantizer_keys
from services.codec.models.qwen3_tts.mel import SPEAKER_MEL, mel_spectrogram, slaney_mel_filterbank
from services.codec.models.qwen3_tts.reference_audio import ReferenceAudioError
from services.codec.models.qwen3_tts.speaker_encoder import (
    SpeakerEncoderConfig,
    load_qwen3_tts_speaker_encoder,
    random_init_speaker_encoder,
    real_speaker_encoder_config,
    tiny_speaker_encoder_config,
)
from tests.golden import fixture_dir, load_cases, materialize_checkpoint
from voxstage.checkpoint import CheckpointError

SR = 24_000
HAVE_GOLDEN = (fixture_dir() / "cases.json").is_file()
golden = pytest.mark.skipif(not HAVE_GOLDEN, reason="tests/fixtures/qwen3_tts not generated yet")


def _tone(seconds: float, sr: int = SR, seed: int = 0) -> np.ndarray:
    n = int(round(seconds * sr))
    t = np.arange(n) / sr
    rng = np.random.default_rng(seed)
    wave = 0.3 * np.sin(2 * np.pi * 190 * t) + 0.2 * np.sin(2 * np.pi * 1300 * t)
    wave += 0.05 * rng.standard_normal(n)
    return wave.astype(np.float32)


@pytest.fixture(scope="module")
def tiny_encoder() -> torch.nn.Module:
    return random_init_encoder(tiny_encoder_config(), seed=0)


@pytest.fixture(scope="module")
def tiny_speaker() -> torch.nn.Module:
    return random_init_speaker_encoder(tiny_speaker_encoder_config(32), seed=0)


# ---------------------------------------------------------------------------------------------- encoder


def test_encoder_config_presets() -> None:
    real = EncoderConfig.from_dict(real_encoder_config())
    sizes = (real.hidden_size, real.num_hidden_layers, real.codebook_dim, real.num_quantizers)
    assert sizes == (512, 8, 256, 32)
    assert real.samples_per_frame == 1920 and real.downsample_kernel == 4 and real.valid_num_quantizers == 16
    tiny = EncoderConfig.from_dict(tiny_encoder_config())
    assert tiny.samples_per_frame == 1920 and tiny.frame_rate == 12.5


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [
        ("use_causal_conv", False, "use_causal_conv"),
        ("hidden_act", "relu", "hidden_act"),
        ("upsampling_ratios", [8, 6, 5], "encode_downsample_rate"),
        ("num_attention_heads", 3, "num_key_value_heads"),
        ("pad_mode", "reflect", "pad_mode"),
        ("num_filters", 0, "num_filters"),
    ],
)
def test_encoder_config_errors_name_the_field(field: str, value: object, match: str) -> None:
    raw = {**tiny_encoder_config(), field: value}
    with pytest.raises(CheckpointError, match=match):
        EncoderConfig.from_dict(raw)


@pytest.mark.parametrize("num_samples", [1, 1919, 1920, 1921, 7000])
def test_encoder_frame_count(tiny_encoder: torch.nn.Module, num_samples: int) -> None:
    codes = tiny_encoder.encode_reference(_tone(num_samples / SR), SR)
    assert codes.shape == (16, math.ceil(num_samples / 1920)) and codes.dtype == torch.int64
    assert 0 <= int(codes.min()) and int(codes.max()) < 2048


def test_encoder_random_init_is_seeded_and_not_degenerate(tiny_encoder: torch.nn.Module) -> None:
    wave = _tone(0.6)
    codes = tiny_encoder.encode_reference(wave, SR)
    again = random_init_encoder(tiny_encoder_config(), seed=0).encode_reference(wave, SR)
    other = random_init_encoder(tiny_encoder_config(), seed=1).encode_reference(wave, SR)
    assert torch.equal(codes, again)
    assert not torch.equal(codes, other)
    # Mimi's default codebooks would map everything to code 0; random centroids must spread the codes.
    assert all(len(set(row.tolist())) > 1 for row in codes)


def test_encoder_is_causal() -> None:
    # fp64 so "equal" can be asserted on the latent too, not only on the (tie-prone) codes.
    model = random_init_encoder(tiny_encoder_config(), seed=3, dtype=torch.float64)
    wave = torch.from_numpy(_tone(0.8).astype(np.float64))[None]
    frames = 4
    with torch.no_grad():
        full = model.latent(wave)
        part = model.latent(wave[:, : frames * 1920])
        # Changing the future must not change the past either.
        altered = wave.clone()
        altered[:, frames * 1920 :] = 0.7
        alt = model.latent(altered)
        codes = [model.quantizer.encode(x) for x in (full, part, alt)]
    assert full.shape[-1] == 10 and part.shape[-1] == frames
    torch.testing.assert_close(part, full[..., :frames], rtol=0, atol=1e-9)
    torch.testing.assert_close(alt[..., :frames], full[..., :frames], rtol=0, atol=1e-9)
    assert not torch.allclose(alt[..., frames:], full[..., frames:])
    assert torch.equal(codes[1], codes[0][..., :frames]) and torch.equal(codes[2][..., :frames], codes[1])


def _write_tokenizer_checkpoint(
    model: torch.nn.Module, root: Path, enc_cfg: dict, extra: bool = True
) -> Path:
    """A speech-tokenizer directory in the released layout, with the Mimi leftovers a real one carries."""
    st = root / "speech_tokenizer"
    st.mkdir(parents=True, exist_ok=True)
    state = {f"encoder.{k}": v.contiguous() for k, v in model.state_dict().items()}
    if extra:
        cfg = model.config
        for key in unused_quantizer_keys(cfg, prefix="encoder.quantizer."):
            if key.endswith("initialized"):
                state[key] = torch.ones(1)
            elif key.endswith("output_proj.weight"):
                state[key] = torch.randn(cfg.hidden_size, cfg.vq_hidden_size, 1)
            elif key.endswith("cluster_usage"):
                state[key] = torch.ones(cfg.codebook_size)
            else:
                state[key] = torch.randn(cfg.codebook_size, cfg.codebook_dim)
        state["decoder.pre_conv.conv.weight"] = torch.randn(4, 4, 3)  # decoder keys are someone else's
    save_file(state, str(st / "model.safetensors"))
    top = {
        "model_type": "qwen3_tts_tokenizer_12hz",
        "encoder_config": enc_cfg,
        "encoder_valid_num_quantizers": 16,
        "input_sample_rate": SR,
        "encode_downsample_rate": 1920,
    }
    (st / "config.json").write_text(json.dumps(top))
    return root


def test_encoder_loader_roundtrip(tiny_encoder: torch.nn.Module, tmp_path: Path) -> None:
    root = _write_tokenizer_checkpoint(tiny_encoder, tmp_path, tiny_encoder_config())
    loaded = load_qwen3_tts_encoder(root)
    wave = _tone(0.5)
    assert torch.equal(loaded.encode_reference(wave, SR), tiny_encoder.encode_reference(wave, SR))
    # A bare speech-tokenizer directory is accepted too.
    bare = load_qwen3_tts_encoder(root / "speech_tokenizer")
    assert torch.equal(bare.encode_reference(wave, SR), tiny_encoder.encode_reference(wave, SR))


def test_encoder_loader_names_renamed_key(tiny_encoder: torch.nn.Module, tmp_path: Path) -> None:
    root = _write_tokenizer_checkpoint(tiny_encoder, tmp_path, tiny_encoder_config())
    path = root / "speech_tokenizer" / "model.safetensors"
    state = load_file(str(path))
    old = "encoder.encoder_transformer.layers.0.self_attn.q_proj.weight"
    state["encoder.encoder_transformer.layers.0.self_attn.query.weight"] = state.pop(old)
    save_file(state, str(path))
    with pytest.raises(CheckpointError) as err:
        load_qwen3_tts_encoder(root)
    assert old in str(err.value) and "self_attn.query.weight" in str(err.value)


def test_encoder_loader_rejects_missing_used_codebook(tiny_encoder: torch.nn.Module, tmp_path: Path) -> None:
    root = _write_tokenizer_checkpoint(tiny_encoder, tmp_path, tiny_encoder_config(), extra=False)
    path = root / "speech_tokenizer" / "model.safetensors"
    state = load_file(str(path))
    gone = "encoder.quantizer.acoustic_residual_vector_quantizer.layers.14.codebook.embed_sum"
    del state[gone]
    save_file(state, str(path))
    with pytest.raises(CheckpointError, match=gone.replace(".", r"\.")):
        load_qwen3_tts_encoder(root)


def test_encoder_loader_wants_encoder_config(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"decoder_config": {}}))
    with pytest.raises(CheckpointError, match="encoder_config"):
        load_qwen3_tts_encoder(tmp_path)


# ------------------------------------------------------------------------------------------- speaker encoder


def test_speaker_encoder_presets_match_released_sizes() -> None:
    # models.md §1.3: 8.9 M parameters at enc_dim 1024 (0.6B), 12 M at 2048 (1.7B).
    for enc_dim, millions in ((1024, 8.85), (2048, 12.0)):
        model = random_init_speaker_encoder(real_speaker_encoder_config(enc_dim))
        assert sum(p.numel() for p in model.parameters()) / 1e6 == pytest.approx(millions, abs=0.05)


def test_speaker_encoder_xvector_shape_and_determinism(tiny_speaker: torch.nn.Module) -> None:
    wave = _tone(1.5)
    xvec = tiny_speaker.embed_reference(wave, SR)
    assert xvec.shape == (32,) and xvec.dtype == torch.float32 and torch.isfinite(xvec).all()
    assert torch.equal(xvec, tiny_speaker.embed_reference(wave, SR))
    # Batched forward on the mel agrees with the single-clip path.
    mel = mel_spectrogram(torch.from_numpy(np.stack([wave, _tone(1.5, seed=9)])))
    with torch.no_grad():
        batch = tiny_speaker(mel)
    torch.testing.assert_close(batch[0], xvec, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(batch[0], batch[1])


def test_speaker_encoder_minimum_length(tiny_speaker: torch.nn.Module) -> None:
    shortest = tiny_speaker.config.min_samples
    assert tiny_speaker.embed_reference(_tone(shortest / SR), SR).shape == (32,)
    with pytest.raises(ReferenceAudioError, match="too short"):
        tiny_speaker.embed_reference(_tone((shortest - 1) / SR), SR)


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [
        ("enc_channels", [32, 32, 32, 32, 64], "sum of the SE-Res2Net widths"),
        ("enc_kernel_sizes", [5, 3, 3, 1], "differ in length"),
        ("mel_dim", 80, "mel_dim"),
        ("enc_res2net_scale", 5, "divisible"),
        ("enc_dim", "32", "enc_dim"),
    ],
)
def test_speaker_config_errors_name_the_field(field: str, value: object, match: str) -> None:
    with pytest.raises(CheckpointError, match=match):
        SpeakerEncoderConfig.from_dict({**tiny_speaker_encoder_config(32), field: value})


def _write_main_checkpoint(root: Path, kind: str, spk: torch.nn.Module | None, hidden: int = 32) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    state = {"talker.model.norm.weight": torch.ones(hidden)}
    if spk is not None:
        state |= {f"speaker_encoder.{k}": v.contiguous() for k, v in spk.state_dict().items()}
    save_file(state, str(root / "model.safetensors"))
    cfg = {
        "model_type": "qwen3_tts",
        "tts_model_type": kind,
        "talker_config": {"hidden_size": hidden},
        "speaker_encoder_config": tiny_speaker_encoder_config(32),
    }
    (root / "config.json").write_text(json.dumps(cfg))
    return root


def test_speaker_loader_roundtrip_and_strictness(tiny_speaker: torch.nn.Module, tmp_path: Path) -> None:
    root = _write_main_checkpoint(tmp_path / "base", "base", tiny_speaker)
    wave = _tone(1.0)
    loaded = load_qwen3_tts_speaker_encoder(root)
    assert torch.equal(loaded.embed_reference(wave, SR), tiny_speaker.embed_reference(wave, SR))

    state = load_file(str(root / "model.safetensors"))
    old = "speaker_encoder.asp.tdnn.conv.weight"
    state["speaker_encoder.asp.tdnn.kernel.weight"] = state.pop(old)
    save_file(state, str(root / "model.safetensors"))
    with pytest.raises(CheckpointError) as err:
        load_qwen3_tts_speaker_encoder(root)
    assert old in str(err.value) and "asp.tdnn.kernel.weight" in str(err.value)


def test_speaker_loader_needs_base_checkpoint(tmp_path: Path) -> None:
    root = _write_main_checkpoint(tmp_path / "cv", "custom_voice", None)
    with pytest.raises(CheckpointError, match="needs a Base checkpoint"):
        load_qwen3_tts_speaker_encoder(root)
    # A config that claims Base but carries no speaker-encoder weights fails just as clearly.
    root = _write_main_checkpoint(tmp_path / "fake_base", "base", None)
    with pytest.raises(CheckpointError, match="needs a Base checkpoint"):
        load_qwen3_tts_speaker_encoder(root)


def test_speaker_loader_checks_enc_dim_against_talker(tiny_speaker: torch.nn.Module, tmp_path: Path) -> None:
    root = _write_main_checkpoint(tmp_path / "b", "base", tiny_speaker, hidden=64)
    with pytest.raises(CheckpointError, match="talker_config.hidden_size"):
        load_qwen3_tts_speaker_encoder(root)


# ----------------------------------------------------------------------------- golden parity (qwen-tts 0.1.1)


@pytest.fixture(scope="module")
def cases() -> dict[str, dict[str, Any]]:
    return load_cases()


@pytest.fixture(scope="module")
def base_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return materialize_checkpoint("base", tmp_path_factory.mktemp("qwen3_tts_base"))


@golden
def test_golden_mel_filterbank_is_librosas(cases: dict[str, dict[str, Any]]) -> None:
    mel = SPEAKER_MEL
    ours = slaney_mel_filterbank(mel.sample_rate, mel.n_fft, mel.n_mels, mel.fmin, mel.fmax)
    assert np.array_equal(ours, cases["speaker_encoder"]["mel_basis"])


@golden
def test_golden_mel(cases: dict[str, dict[str, Any]]) -> None:
    case = cases["speaker_encoder"]
    mel = mel_spectrogram(torch.from_numpy(case["wav"])[None])[0].T  # reference layout [frames, n_mels]
    torch.testing.assert_close(mel, torch.from_numpy(case["mel"]), rtol=0, atol=1e-4)


@golden
def test_golden_xvector(cases: dict[str, dict[str, Any]], base_checkpoint: Path) -> None:
    case = cases["speaker_encoder"]
    model = load_qwen3_tts_speaker_encoder(base_checkpoint)
    xvec = model.embed_reference(case["wav"], SR)
    torch.testing.assert_close(xvec, torch.from_numpy(case["x_vector"]), rtol=0, atol=1e-4)


@golden
def test_golden_encoder_codes(cases: dict[str, dict[str, Any]], base_checkpoint: Path) -> None:
    case = cases["tokenizer_encode"]
    model = load_qwen3_tts_encoder(base_checkpoint)
    codes = model.encode_reference(case["wav"], SR)
    expected = torch.from_numpy(case["codes"])
    assert codes.shape == expected.shape == (16, math.ceil(len(case["wav"]) / 1920))
    assert torch.equal(codes, expected)
    with torch.no_grad():
        latent = model.latent(torch.from_numpy(case["wav"])[None])[0]
    torch.testing.assert_close(latent, torch.from_numpy(case["latent"]), rtol=1e-4, atol=1e-4)


@golden
def test_golden_checkpoint_strictness(base_checkpoint: Path, tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    shutil.copytree(base_checkpoint, root)
    path = root / "speech_tokenizer" / "model.safetensors"
    state = load_file(str(path))
    old = "encoder.downsample.conv.weight"
    state["encoder.downsample.weight"] = state.pop(old)
    save_file(state, str(path))
    with pytest.raises(CheckpointError) as err:
        load_qwen3_tts_encoder(root)
    assert old in str(err.value) and "encoder.downsample.weight" in str(err.value)


@golden
@pytest.mark.parametrize("variant", ["custom_voice", "voice_design"])
def test_golden_non_base_has_no_speaker_encoder(variant: str, tmp_path: Path) -> None:
    root = materialize_checkpoint(variant, tmp_path / variant)
    with pytest.raises(CheckpointError, match="voice clone from reference audio needs a Base checkpoint"):
        load_qwen3_tts_speaker_encoder(root)
    # The speech tokenizer (and so the encoder) ships with every variant.
    assert load_qwen3_tts_encoder(root).num_quantizers == 16


@golden
def test_golden_bf16_checkpoint_gives_same_xvector(cases: dict[str, dict[str, Any]], tmp_path: Path) -> None:
    # Released model.safetensors is bf16; the fixture values are exact in bf16, so an fp32 model loaded
    # from it must reproduce the reference x-vector as well.
    root = materialize_checkpoint("base", tmp_path / "bf16", dtype="bfloat16")
    case = cases["speaker_encoder"]
    xvec = load_qwen3_tts_speaker_encoder(root).embed_reference(case["wav"], SR)
    torch.testing.assert_close(xvec, torch.from_numpy(case["x_vector"]), rtol=0, atol=1e-4)
