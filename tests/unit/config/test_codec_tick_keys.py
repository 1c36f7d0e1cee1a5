"""``codec_tick_policy`` / ``codec_tick_budget_ms`` / ``codec_first_chunks``: defaults and overrides, and
the codec builds its engine from them (refusals and the duplex warning: test_stage_owned_keys.py)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from voxstage.config import load_deploy_config

REPO = Path(__file__).resolve().parents[3]
QWEN = REPO / "deploy" / "qwen3_tts.yaml"


def test_defaults_and_overrides() -> None:
    codec = load_deploy_config(QWEN, platform="cuda").codec
    assert (codec.codec_tick_policy, codec.codec_tick_budget_ms) == (None, 20.0)  # None: the family's
    sets = ["stages.1.codec_tick_policy=fifo", "stages.1.codec_tick_budget_ms=12.5"]
    codec = load_deploy_config(QWEN, platform="cuda", overrides=sets).codec
    assert (codec.codec_tick_policy, codec.codec_tick_budget_ms) == ("fifo", 12.5)


def test_the_policy_is_the_deploy_files_else_the_familys_and_fifo_off_a_gpu() -> None:
    from services.codec.main import tick_policy

    qwen = load_deploy_config(QWEN, platform="cuda").codec
    audio8 = load_deploy_config(REPO / "deploy" / "audio8_tts.yaml", platform="cuda").codec
    assert qwen.codec_tick_policy is None and audio8.codec_tick_policy is None  # the seeds name none
    # Each family's measured choice (its descriptor): bounded ticks served Qwen3-TTS best, fifo Audio8.
    assert tick_policy(qwen, "qwen3_tts", "cuda") == "deadline"
    assert tick_policy(audio8, "audio8_tts", "cuda") == "fifo"
    assert tick_policy(qwen, "qwen3_tts", "cpu") == "fifo"
    fifo = load_deploy_config(QWEN, platform="cuda", overrides=["stages.1.codec_tick_policy=fifo"]).codec
    assert tick_policy(fifo, "qwen3_tts", "cuda") == "fifo"
    deadline = ["stages.1.codec_tick_policy=deadline"]
    audio8_set = load_deploy_config(REPO / "deploy" / "audio8_tts.yaml", platform="cuda", overrides=deadline)
    assert tick_policy(audio8_set.codec, "audio8_tts", "cuda") == "deadline"


def test_first_chunks_reaches_the_engine_and_is_said_to_do_nothing_under_fifo(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    import torch

    from services.codec.main import build_engine, tick_policy
    from services.codec.models import load_codec
    from voxstage.presets import resolve_model

    assert load_deploy_config(QWEN, platform="cuda").codec.codec_first_chunks == "lead"
    config = load_deploy_config(QWEN, platform="cpu", overrides=["stages.1.codec_first_chunks=yield"])
    source = resolve_model("qwen3-tts-tiny", cache=tmp_path)
    runtime = load_codec(source, device="cpu", dtype=torch.float32, max_streams=config.codec.max_num_seqs)
    with caplog.at_level(logging.WARNING, logger="services.codec.main"):
        engine = build_engine(config, runtime, "cpu")
    assert engine.first_chunks == "yield"
    assert "codec_first_chunks ranks chunks in deadline ticks" in caplog.text  # CPU ticks are fifo
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="services.codec.main"):
        assert tick_policy(config.codec, "qwen3_tts", "cuda") == "deadline"
        assert tick_policy(load_deploy_config(QWEN, platform="cpu").codec, "qwen3_tts", "cpu") == "fifo"
    assert not caplog.text  # deadline ticks use it; unset under fifo, nothing to say


def test_the_urgent_lane_builds_a_laned_engine_and_says_it_has_no_priority_off_a_gpu(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    import torch

    from services.codec.lanes import LanedCodecEngine
    from services.codec.main import build_engine
    from services.codec.models import load_codec
    from voxstage.presets import resolve_model

    assert load_deploy_config(QWEN, platform="cuda").codec.codec_urgent_lane_ms is None  # one lane
    config = load_deploy_config(QWEN, platform="cpu", overrides=["stages.1.codec_urgent_lane_ms=8"])
    source = resolve_model("qwen3-tts-tiny", cache=tmp_path)
    runtime = load_codec(source, device="cpu", dtype=torch.float32, max_streams=config.codec.max_num_seqs)
    with caplog.at_level(logging.WARNING, logger="services.codec.main"):
        engine = build_engine(config, runtime, "cpu")
    assert isinstance(engine, LanedCodecEngine) and engine.urgent.budget_s == pytest.approx(0.008)
    assert engine.bulk.budget_s == engine.tick_budget_s and engine.urgent.stream is None
    assert "no CUDA stream priority" in caplog.text
    assert not isinstance(
        build_engine(load_deploy_config(QWEN, platform="cpu"), runtime, "cpu"), LanedCodecEngine
    )
