"""Loading ``codec.pth`` in the released layout (models.md §2.5), strictly, and the codec stage's runtime.

The file written by ``save_codec_checkpoint`` has what a released one has: a ``state_dict`` wrapper,
``generator.`` prefixes, parametrization weight norm on the encoder/decoder convs, legacy ``weight_g`` /
``weight_v`` on the VQ projections, and ``freqs_cis`` / ``causal_mask`` buffers. Tests add a
``discriminator.*`` entry (a training checkpoint has one) and rewrite the layout to the other forms.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from services.codec.models import load_codec
from services.codec.models.audio8_tts.codec import Audio8Codec
from services.codec.models.audio8_tts.config import Audio8CodecConfig
from services.codec.models.audio8_tts.loader import (
    config_from_json,
    load_audio8_codec,
    random_init,
    save_codec_checkpoint,
)
from services.codec.models.audio8_tts.presets import (
    codec_config_fields,
    codec_preset,
    released_config,
    tiny_config,
)
from services.codec.models.audio8_tts.streaming import Audio8StreamingDecoder
from tests.unit.codec.codec_kit import audio8_codes
from voxstage.checkpoint import CheckpointError
from voxstage.presets import ModelSource

TOL = 1e-5
P_G, P_V = ".parametrizations.weight.original0", ".parametrizations.weight.original1"


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[Audio8Codec, Path, dict]:
    model = random_init(tiny_config(), seed=3)
    folder = tmp_path_factory.mktemp("audio8")
    path = save_codec_checkpoint(model, folder)
    (folder / "config.json").write_text(
        json.dumps({"model_type": "arktts", **codec_config_fields(model.config)})
    )
    raw = torch.load(path, weights_only=True)
    return model, folder, raw


def _write(folder: Path, obj: object, config: dict | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    torch.save(obj, folder / "codec.pth")
    fields = config if config is not None else codec_config_fields(tiny_config())
    (folder / "config.json").write_text(json.dumps(fields))
    return folder


_codes = audio8_codes


def test_written_file_has_the_released_layout(saved: tuple[Audio8Codec, Path, dict]) -> None:
    _, _, raw = saved
    assert set(raw) == {"state_dict"}
    keys = raw["state_dict"].keys()
    assert all(k.startswith("generator.") for k in keys)
    assert (
        "generator.decoder.model.0.conv" + P_G in keys and "generator.decoder.model.0.conv.weight" not in keys
    )
    assert "generator.encoder.block.1.block.4.conv" + P_V in keys
    assert "generator.decoder.model.1.block.1.conv" + P_G in keys  # transposed conv, weight-normed too
    assert "generator.quantizer.quantizer.quantizers.3.in_proj.weight_g" in keys
    assert "generator.quantizer.semantic_quantizer.quantizers.0.out_proj.weight_v" in keys
    assert "generator.quantizer.upsample.0.0.conv.weight" in keys  # re-sampler convs: plain
    assert (
        "generator.quantizer.post_module.freqs_cis" in keys
        and "generator.quantizer.post_module.causal_mask" in keys
    )


def test_released_layout_loads_and_reproduces_decode(
    saved: tuple[Audio8Codec, Path, dict], tmp_path: Path
) -> None:
    model, folder, raw = saved
    codes = _codes(0, 20)
    with torch.inference_mode():
        want = model(codes)
        loaded = load_audio8_codec(folder)
        assert loaded.config == model.config
        assert (loaded(codes) - want).abs().max().item() <= TOL
    # A training checkpoint's discriminator keys sit beside generator.*; only generator.* counts.
    with_disc = {"state_dict": {**raw["state_dict"], "discriminator.mpd.0.weight": torch.ones(3)}}
    with torch.inference_mode():
        assert (
            load_audio8_codec(_write(tmp_path / "disc", with_disc))(codes) - want
        ).abs().max().item() <= TOL


def test_both_weight_norm_forms_and_bare_layout_load(
    saved: tuple[Audio8Codec, Path, dict], tmp_path: Path
) -> None:
    model, _, raw = saved
    # Every pair in the legacy form, no wrapper, no prefix: still the same model.
    legacy = {}
    for key, value in raw["state_dict"].items():
        key = key.removeprefix("generator.")
        legacy[key.replace(P_G, ".weight_g").replace(P_V, ".weight_v")] = value
    codes = _codes(1, 9)
    with torch.inference_mode():
        got = load_audio8_codec(_write(tmp_path / "legacy", legacy))(codes)
        assert (got - model(codes)).abs().max().item() <= TOL
    # The fold really uses g: a pair whose magnitude is scaled decodes differently.
    scaled = dict(legacy)
    key = "decoder.model.0.conv.weight_g"
    scaled[key] = scaled[key] * 1.5
    with torch.inference_mode():
        assert (load_audio8_codec(_write(tmp_path / "scaled", scaled))(codes) - got).abs().max().item() > 1e-3


def test_missing_key_is_named(saved: tuple[Audio8Codec, Path, dict], tmp_path: Path) -> None:
    _, _, raw = saved
    state = dict(raw["state_dict"])
    del state["generator.quantizer.post_module.layers.1.ffn_norm.weight"]
    del state["generator.decoder.model.2.block.3.block.1.conv" + P_G]
    del state["generator.decoder.model.2.block.3.block.1.conv" + P_V]
    with pytest.raises(CheckpointError, match="missing keys") as info:
        load_audio8_codec(_write(tmp_path / "missing", {"state_dict": state}))
    assert "quantizer.post_module.layers.1.ffn_norm.weight" in str(info.value)
    assert "decoder.model.2.block.3.block.1.conv.weight" in str(info.value)
    # Half a weight-norm pair is named as such.
    half = dict(raw["state_dict"])
    del half["generator.decoder.model.6.conv" + P_V]
    with pytest.raises(CheckpointError, match=r"decoder\.model\.6\.conv.*direction"):
        load_audio8_codec(_write(tmp_path / "half", {"state_dict": half}))


def test_unexpected_key_is_named(saved: tuple[Audio8Codec, Path, dict], tmp_path: Path) -> None:
    _, _, raw = saved
    state = {**raw["state_dict"], "generator.decoder.model.9.alpha": torch.ones(1, 6, 1)}
    with pytest.raises(CheckpointError, match=r"unexpected keys: decoder\.model\.9\.alpha"):
        load_audio8_codec(_write(tmp_path / "unexpected", {"state_dict": state}))


def test_shape_mismatch_is_explained(saved: tuple[Audio8Codec, Path, dict], tmp_path: Path) -> None:
    _, _, raw = saved
    state = dict(raw["state_dict"])
    state["generator.quantizer.post_module.layers.0.feed_forward.w2.weight"] = torch.zeros(64, 95)
    want = r"shape mismatches: quantizer\.post_module\.layers\.0\.feed_forward\.w2\.weight: "
    want += r"checkpoint \(64, 95\) vs model \(64, 96\)"
    with pytest.raises(CheckpointError, match=want):
        load_audio8_codec(_write(tmp_path / "shape", {"state_dict": state}))


def test_config_json_must_agree_with_weights(saved: tuple[Audio8Codec, Path, dict], tmp_path: Path) -> None:
    _, _, raw = saved
    fields = codec_config_fields(tiny_config())
    with pytest.raises(CheckpointError, match="codec_post_n_head"):
        load_audio8_codec(_write(tmp_path / "heads", raw, {**fields, "codec_post_n_head": 3}))
    with pytest.raises(CheckpointError, match="codec_frame_size 1024"):
        load_audio8_codec(_write(tmp_path / "frame", raw, {**fields, "codec_frame_size": 1024}))
    with pytest.raises(CheckpointError, match="missing keys: quantizer.post_module.layers.2"):
        load_audio8_codec(_write(tmp_path / "layers", raw, {**fields, "codec_post_n_layer": 3}))
    with pytest.raises(CheckpointError, match="not a readable torch checkpoint"):
        (tmp_path / "junk").mkdir()
        (tmp_path / "junk" / "codec.pth").write_bytes(b"not a pickle")
        (tmp_path / "junk" / "config.json").write_text(json.dumps(fields))
        load_audio8_codec(tmp_path / "junk")


def test_released_config_json_gives_released_geometry() -> None:
    fields = codec_config_fields(released_config())
    assert fields["codec_post_n_layer"] == 8 and fields["codec_post_n_local_heads"] == 8
    assert fields["codec_post_intermediate_size"] == 1216 and fields["codec_frame_size"] == 2048
    assert config_from_json(fields) == Audio8CodecConfig.released() == codec_preset("audio8-tts-0.6b")
    assert config_from_json({}) == Audio8CodecConfig.released()  # the reference constructor's defaults
    with pytest.raises(CheckpointError, match="codec_post_n_head"):
        config_from_json({"codec_post_n_head": 0})


def test_random_init_is_seeded() -> None:
    a, b, c = (random_init(tiny_config(), seed=s) for s in (7, 7, 8))
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not torch.equal(sa["decoder.model.0.conv.weight"], sc["decoder.model.0.conv.weight"])


def test_load_codec_runtime(saved: tuple[Audio8Codec, Path, dict]) -> None:
    model, folder, _ = saved
    runtime = load_codec(ModelSource("audio8-test", folder, "arktts"), max_streams=2)
    assert runtime.family == "audio8_tts" and runtime.speaker_encoder is None
    assert (runtime.num_groups, runtime.codebook_size, runtime.sample_rate) == (10, 4096, 44100)
    assert (runtime.samples_per_frame, runtime.decoder_window_frames) == (2048, 128)
    pool = runtime.decoder
    assert isinstance(pool, Audio8StreamingDecoder) and pool.max_streams == 4
    assert runtime.state_bytes_per_stream == pool.state_bytes_per_stream() > 0
    codes = _codes(2, 6)
    with torch.inference_mode():
        assert (pool.decode(codes, torch.tensor([3])) - model(codes)).abs().max().item() <= TOL
    ref = runtime.encode_reference(np.zeros(30000, np.float32) + 0.1, 24000)
    assert ref.shape == (27, 10) and ref.dtype == np.int64  # 30000 at 24 kHz -> 55125 at 44.1 -> ceil(/2048)
