"""Mimi equals the reference moshi 0.2.13 on the tiny checkpoint of the golden fixtures.

The checkpoint directory is written from the fixture (kyutai layout) and loaded through ``load_mimi``, so
the strict loader, the codebook precompute and both run modes are checked against moshi's recorded outputs:
offline and frame-by-frame streaming, encode and decode, with the released 250-step context and with a
10-step one whose ring wraps after 5 frames (where moshi's streaming and offline passes part ways).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from services.codec.models.mimi.loader import load_mimi, load_mimi_config
from services.codec.models.mimi.model import MimiModel
from services.codec.models.mimi.presets import mimi_config_dict
from services.codec.models.mimi.streaming import MimiStreamingCodec
from tests import golden_personaplex_mimi as golden

META = golden.load_meta()
TOL = META["tolerances"]
SPF = 1920


@pytest.fixture(scope="module")
def ckpt_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return golden.materialize_checkpoint(tmp_path_factory.mktemp("mimi_tiny"))


@pytest.fixture(scope="module")
def model(ckpt_dir: Path) -> MimiModel:
    return load_mimi(ckpt_dir)


@pytest.fixture(scope="module")
def short_model(ckpt_dir: Path) -> MimiModel:
    context = META["cases"]["short"]["context"]
    config = load_mimi_config(ckpt_dir).with_overrides({"transformer": {"context": context}})
    return load_mimi(ckpt_dir, config=config)


@pytest.fixture(scope="module")
def ref() -> dict[str, np.ndarray]:
    return golden.load_arrays()


def _max_err(ours: torch.Tensor, theirs: np.ndarray) -> float:
    assert tuple(ours.shape) == theirs.shape, (tuple(ours.shape), theirs.shape)
    return float(np.abs(ours.double().numpy() - theirs.astype(np.float64)).max())


def _decoder_transformer_out(model: MimiModel, run: object) -> torch.Tensor:
    """Concatenated outputs of ``model.decoder_transformer`` while ``run()`` executes ([B, C, steps])."""
    outs: list[torch.Tensor] = []
    handle = model.decoder_transformer.register_forward_hook(lambda _m, _i, out: outs.append(out))
    try:
        run()  # type: ignore[operator]
    finally:
        handle.remove()
    return torch.cat(outs, dim=-1)


def test_fixture_config_is_the_tiny_preset(ckpt_dir: Path) -> None:
    assert mimi_config_dict("personaplex-tiny") == golden.load_config()
    assert load_mimi_config(ckpt_dir).to_dict() == golden.load_config()
    assert {p.name for p in ckpt_dir.iterdir()} == {"tokenizer-tiny.safetensors", "mimi_config.json"}
    total = sum(p.stat().st_size for p in golden.fixture_dir().iterdir())
    assert 0 < total < 1_500_000, f"Mimi fixtures take {total} bytes"


def test_offline_decode_matches_moshi(model: MimiModel, ref: dict[str, np.ndarray]) -> None:
    codes = golden.decode_codes()
    with torch.inference_mode():
        pcm = model.decode(codes)[0]
    # The recorded waveform must be lively, or matching it would prove little.
    assert ref["main.decode_pcm_offline"].std() > 0.03
    assert _max_err(pcm, ref["main.decode_pcm_offline"]) <= TOL["pcm_abs"]


@pytest.mark.parametrize("chunks", ["one-frame", "mixed"])
def test_streaming_decode_matches_moshi_streaming(
    model: MimiModel, ref: dict[str, np.ndarray], chunks: str
) -> None:
    codes = golden.decode_codes()
    frames = codes.shape[-1]
    sizes = [1] * frames if chunks == "one-frame" else [3, 1, 7, 2, 12, 5, 10]
    assert sum(sizes) == frames
    codec = MimiStreamingCodec(model, max_streams=2)
    pieces, start = [], 0
    for size in sizes:
        pieces.append(codec.decode(codes[..., start : start + size], torch.tensor([1])))
        start += size
    assert _max_err(torch.cat(pieces, dim=-1)[0], ref["main.decode_pcm_stream"]) <= TOL["pcm_abs"]


def test_encode_matches_moshi(model: MimiModel, ref: dict[str, np.ndarray]) -> None:
    pcm = golden.encode_pcm()
    with torch.inference_mode():
        latent = model.encode_latent(pcm)
        codes = model.encode(pcm)
    assert _max_err(latent[0], ref["main.encode_latent_offline"]) <= TOL["latent_abs"]
    np.testing.assert_array_equal(codes[0].numpy(), ref["main.encode_codes_offline"])
    # Frame by frame, as the reference server feeds the user's audio.
    codec = MimiStreamingCodec(model, max_streams=1)
    steps = [codec.encode_with_latent(pcm[:, t * SPF : (t + 1) * SPF], torch.tensor([0])) for t in range(40)]
    stream_codes = torch.cat([c for c, _ in steps], dim=-1)
    stream_latent = torch.cat([lat for _, lat in steps], dim=-1)
    assert _max_err(stream_latent[0], ref["main.encode_latent_stream"]) <= TOL["latent_abs"]
    np.testing.assert_array_equal(stream_codes[0].numpy(), ref["main.encode_codes_stream"])
    # Several distinct codes per codebook: a constant code stream would make equality trivial.
    assert all(len(set(row.tolist())) >= 5 for row in stream_codes[0])


def test_wrapped_window_matches_moshi_streaming_not_offline(
    short_model: MimiModel, ref: dict[str, np.ndarray]
) -> None:
    """With a 10-step context moshi's streamed frames lose one key on each frame's first step once the ring
    wraps; the default window (and the streaming pool) reproduce that, ``full_window`` the offline pass."""
    frames = META["cases"]["short"]["frames"]
    codes = golden.decode_codes()[..., :frames]
    pcm = golden.encode_pcm()[:, : frames * SPF]
    moshi_off, moshi_st = ref["short.decoder_transformer_offline"], ref["short.decoder_transformer_stream"]
    # Guard: the two reference runs really differ after the wrap, and agree before it.
    assert np.abs(moshi_off - moshi_st)[:, 10:].max() > 1e-2
    assert np.abs(moshi_off - moshi_st)[:, :10].max() < 1e-5

    with torch.inference_mode():
        full = _decoder_transformer_out(short_model, lambda: short_model.decode(codes, full_window=True))
        aligned = _decoder_transformer_out(short_model, lambda: short_model.decode(codes))
    codec = MimiStreamingCodec(short_model, max_streams=1)
    streamed = _decoder_transformer_out(
        short_model, lambda: [codec.decode(codes[..., t : t + 1], torch.tensor([0])) for t in range(frames)]
    )
    assert _max_err(full[0], moshi_off) <= TOL["transformer_abs"]
    assert _max_err(aligned[0], moshi_st) <= TOL["transformer_abs"]
    assert _max_err(streamed[0], moshi_st) <= TOL["transformer_abs"]

    with torch.inference_mode():
        lat_full = short_model.encode_latent(pcm, full_window=True)
        lat_aligned = short_model.encode_latent(pcm)
    codes_st, lat_st = zip(
        *[
            codec.encode_with_latent(pcm[:, t * SPF : (t + 1) * SPF], torch.tensor([0]))
            for t in range(frames)
        ],
        strict=True,
    )
    assert _max_err(lat_full[0], ref["short.encode_latent_offline"]) <= TOL["latent_abs"]
    assert _max_err(lat_aligned[0], ref["short.encode_latent_stream"]) <= TOL["latent_abs"]
    assert _max_err(torch.cat(lat_st, dim=-1)[0], ref["short.encode_latent_stream"]) <= TOL["latent_abs"]
    np.testing.assert_array_equal(torch.cat(codes_st, dim=-1)[0].numpy(), ref["short.encode_codes_stream"])
    with torch.inference_mode():
        np.testing.assert_array_equal(
            short_model.quantizer.encode(lat_full)[0].numpy(), ref["short.encode_codes_offline"]
        )
