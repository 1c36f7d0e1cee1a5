"""``codec_tick_policy`` / ``codec_tick_budget_ms``: the codec stage's keys, refused on the talker, checked in
range, inert (with a warning) on duplex sessions; and the codec builds its engine from them."""

from __future__ import annotations

from pathlib import Path

import pytest

from voxstage.config import ConfigError, load_deploy_config

REPO = Path(__file__).resolve().parents[3]
QWEN = REPO / "deploy" / "qwen3_tts.yaml"


def test_defaults_and_overrides() -> None:
    codec = load_deploy_config(QWEN, platform="cuda").codec
    assert (codec.codec_tick_policy, codec.codec_tick_budget_ms) == (None, 20.0)  # None: the family's
    sets = ["stages.1.codec_tick_policy=fifo", "stages.1.codec_tick_budget_ms=12.5"]
    codec = load_deploy_config(QWEN, platform="cuda", overrides=sets).codec
    assert (codec.codec_tick_policy, codec.codec_tick_budget_ms) == ("fifo", 12.5)


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        (
            "stages.0.codec_tick_policy=fifo",
            "stages[0].codec_tick_policy: belongs to the codec stage (stage_id 1)",
        ),
        ("stages.0.codec_tick_budget_ms=10", "stages[0].codec_tick_budget_ms: belongs to the codec stage"),
        ("stages.1.codec_tick_policy=edf", "stages[1].codec_tick_policy"),
        ("stages.1.codec_tick_budget_ms=0", "stages[1].codec_tick_budget_ms"),
    ],
)
def test_misplaced_or_bad_values_are_refused_naming_the_key(override: str, expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_deploy_config(QWEN, platform="cuda", overrides=[override])
    assert any(expected in str(issue) for issue in info.value.issues), info.value.issues


def test_duplex_sessions_warn_that_the_keys_do_nothing() -> None:
    path = REPO / "deploy" / "personaplex.yaml"
    assert not any("codec_tick" in str(w) for w in load_deploy_config(path, platform="cuda").warnings)
    cfg = load_deploy_config(path, platform="cuda", overrides=["stages.1.codec_tick_budget_ms=10"])
    assert any("codec_tick_budget_ms" in str(w) and "duplex" in str(w) for w in cfg.warnings), cfg.warnings


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
