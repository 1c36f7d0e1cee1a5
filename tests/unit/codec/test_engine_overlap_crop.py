"""The codec engine's overlap+crop mode (``codec_decode: overlap_crop``): every chunk is decoded afresh behind
up to ``left_context`` earlier frames whose audio is cropped, which is exactly a stateless decode of each
window; while a stream is shorter than its context that equals the offline decode, later it only
approximates it. Checked on the tiny Audio8 codec against plain ``model(codes)`` calls per window."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from services.codec.engine import ChunkSchedule, CodecEngine
from services.codec.models.audio8_tts.codec import Audio8Codec
from services.codec.models.audio8_tts.config import Audio8CodecConfig
from services.codec.models.audio8_tts.loader import random_init
from services.codec.models.audio8_tts.streaming import Audio8StreamingDecoder
from voxstage.config import ConfigError, check_codec_against_model, load_deploy_config

SPF = 2048
LEFT = 25


@pytest.fixture(scope="module")
def model() -> Audio8Codec:
    return random_init(Audio8CodecConfig.tiny(), seed=3)


def _engine(model: Audio8Codec, left: int, streams: int = 2) -> CodecEngine:
    return CodecEngine(
        Audio8StreamingDecoder(model, 2 * streams), max_streams=streams, schedule=ChunkSchedule(4, 25),
        num_groups=10, sample_rate=44_100, codebook_size=4096, left_context=left,
    )  # fmt: skip


def _run(engine: CodecEngine, codes: dict[str, np.ndarray], prefix: np.ndarray | None = None) -> dict:
    """Push every stream's frames a few at a time, as a talker would: id -> [(offset, frames, pcm)]."""
    out: dict[str, list[tuple[int, int, np.ndarray]]] = {sid: [] for sid in codes}
    for sid in codes:
        engine.open(sid, prefix=prefix)
    pos = dict.fromkeys(codes, 0)
    while engine.has_work() or any(pos[s] < len(c) for s, c in codes.items()):
        for sid, c in codes.items():
            if pos[sid] < len(c):
                engine.push(sid, c[pos[sid] : pos[sid] + 3])
                pos[sid] += 3
                if pos[sid] >= len(c):
                    engine.finish(sid)
        for o in engine.step():
            out[o.stream_id].append((o.sample_offset, o.frames, o.pcm))
    return out


def _window(model: Audio8Codec, codes: np.ndarray, start: int, end: int, left: int) -> np.ndarray:
    """The stateless decode of frames [start, end) behind up to ``left`` earlier frames, cropped."""
    ctx = max(0, start - left)
    with torch.inference_mode():
        wav = model(torch.from_numpy(codes[ctx:end].T.copy()).unsqueeze(0))[0].numpy()
    return wav[(start - ctx) * SPF :]


def test_each_chunk_is_a_cropped_stateless_window(model: Audio8Codec) -> None:
    rng = np.random.default_rng(0)
    codes = {"a": rng.integers(0, 4096, (70, 10)), "b": rng.integers(0, 4096, (41, 10))}
    got = _run(_engine(model, LEFT), codes)
    for sid, c in codes.items():
        chunks = [x for x in got[sid] if x[1]]
        assert sum(f for _, f, _ in chunks) == len(c)
        start = 0
        for offset, frames, pcm in chunks:
            assert offset == start * SPF
            np.testing.assert_allclose(pcm, _window(model, c, start, start + frames, LEFT), atol=1e-5)
            start += frames
    # Not the exact decode: past the context the seams differ from one pass over the whole stream.
    whole = np.concatenate([p for _, _, p in got["a"]])
    with torch.inference_mode():
        offline = model(torch.from_numpy(codes["a"].T.copy()).unsqueeze(0))[0].numpy()
    assert np.abs(whole[: LEFT * SPF] - offline[: LEFT * SPF]).max() <= 1e-5  # the context covers it all
    assert np.abs(whole - offline).max() > 1e-4


def test_a_reference_prefix_is_context_not_output(model: Audio8Codec) -> None:
    rng = np.random.default_rng(1)
    prefix, codes = rng.integers(0, 4096, (30, 10)), rng.integers(0, 4096, (12, 10))
    got = [x for x in _run(_engine(model, LEFT, 1), {"s": codes}, prefix=prefix)["s"] if x[1]]
    history = np.concatenate([prefix, codes])
    start = 0
    for _, frames, pcm in got:
        want = _window(model, history, len(prefix) + start, len(prefix) + start + frames, LEFT)
        np.testing.assert_allclose(pcm, want, atol=1e-5)
        start += frames
    assert start == len(codes)


def test_the_deploy_key_selects_it_and_is_checked() -> None:
    seed = Path(__file__).resolve().parents[3] / "deploy" / "audio8_tts.yaml"
    key = "connectors.connector_of_shared_memory.extra"
    assert not load_deploy_config(seed).chunk_plan.overlap_crop  # exact streaming is the default
    cfg = load_deploy_config(seed, overrides=[f"{key}.codec_decode=overlap_crop"])
    assert cfg.chunk_plan.overlap_crop and cfg.chunk_plan.left_context_frames == 25  # the seed's value
    issues = check_codec_against_model(cfg, decoder_window_frames=128, stateful=False, num_codebooks=10)
    assert [i.severity for i in issues] == ["warning"] and "below the decoder window" in issues[0].message
    with pytest.raises(ConfigError, match="codec_decode"):
        load_deploy_config(seed, overrides=[f"{key}.codec_decode=sometimes"])
    with pytest.raises(ValueError, match="left_context"):
        CodecEngine(Audio8StreamingDecoder(random_init(Audio8CodecConfig.tiny(), 0), 2), max_streams=1,
                    schedule=ChunkSchedule(1, 4), num_groups=10, left_context=-1)  # fmt: skip
