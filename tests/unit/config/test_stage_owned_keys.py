"""Keys one stage reads (``checks.CODEC_ONLY_KEYS`` / ``TALKER_ONLY_KEYS``, the codec's tick schedule, the
talker's pacing): set on the other stage or out of range they are refused naming the key, and on duplex
sessions, which neither reads, they load with a warning naming the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from voxstage.config import ConfigError, load_deploy_config

REPO = Path(__file__).resolve().parents[3]
QWEN = REPO / "deploy" / "qwen3_tts.yaml"
PERSONAPLEX = REPO / "deploy" / "personaplex.yaml"
AUDIO8 = REPO / "deploy" / "audio8_tts.yaml"


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("stages.0.codec_tick_policy=fifo", "stages[0].codec_tick_policy: belongs to the codec stage"),
        ("stages.0.codec_tick_budget_ms=10", "stages[0].codec_tick_budget_ms: belongs to the codec stage"),
        ("stages.1.codec_tick_policy=edf", "stages[1].codec_tick_policy"),
        ("stages.1.codec_tick_budget_ms=0", "stages[1].codec_tick_budget_ms"),
        ("stages.0.codec_first_chunks=yield", "stages[0].codec_first_chunks: belongs to the codec stage"),
        ("stages.1.codec_first_chunks=first", "stages[1].codec_first_chunks"),
        ("stages.0.codec_urgent_lane_ms=10", "stages[0].codec_urgent_lane_ms: belongs to the codec stage"),
        ("stages.1.codec_urgent_lane_ms=0", "stages[1].codec_urgent_lane_ms"),
        ("stages.1.pace_realtime_x=2", "stages[1].pace_realtime_x: belongs to the talker stage (stage_id 0)"),
        ("stages.1.pace_from_streams=8", "stages[1].pace_from_streams: belongs to the talker stage"),
        ("stages.1.pace_ahead_s=3", "stages[1].pace_ahead_s: belongs to the talker stage"),
        ("stages.0.pace_realtime_x=0.5", "must be 0 (no pacing) or at least 1 (real time), got 0.5"),
        ("stages.0.pace_from_streams=0", "stages[0].pace_from_streams"),
        ("stages.0.pace_ahead_s=0", "stages[0].pace_ahead_s"),
        ("stages.1.pace_ride_s=3", "stages[1].pace_ride_s: belongs to the talker stage"),
        ("stages.0.pace_ride_s=-1", "stages[0].pace_ride_s"),
    ],
)
def test_misplaced_or_bad_values_are_refused_naming_the_key(override: str, expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_deploy_config(QWEN, platform="cuda", overrides=[override])
    assert any(expected in str(issue) for issue in info.value.issues), info.value.issues


def test_riding_needs_a_cushion_of_its_own_or_the_family_s() -> None:
    """Audio8 paces by no default, so riding alone would do nothing; Qwen3-TTS paces by default on a GPU (a
    deploy file without `pipeline` learns its family from the model: the talker's start decides)."""
    with pytest.raises(ConfigError) as info:
        sets = ["pipeline=audio8_tts", "stages.0.pace_ride_s=2"]
        load_deploy_config(AUDIO8, platform="cuda", overrides=sets)
    assert any("stages[0].pace_ride_s: needs pace_ahead_s" in str(i) for i in info.value.issues)
    qwen = load_deploy_config(QWEN, platform="cuda", overrides=["stages.0.pace_ride_s=0"])
    assert qwen.talker.pace_ride_s == 0


@pytest.mark.parametrize(
    "override",
    [
        "stages.1.codec_tick_budget_ms=10",
        "stages.1.codec_first_chunks=yield",
        "stages.1.codec_urgent_lane_ms=10",
        "stages.0.pace_realtime_x=3",
        "stages.0.pace_ahead_s=3",
        "stages.0.pace_ride_s=3",
    ],
)
def test_duplex_sessions_warn_that_the_keys_do_nothing(override: str) -> None:
    key = override.split("=")[0].split(".")[-1]
    assert not any(key in str(w) for w in load_deploy_config(PERSONAPLEX, platform="cuda").warnings)
    cfg = load_deploy_config(PERSONAPLEX, platform="cuda", overrides=[override])
    assert any(key in str(w) and "duplex" in str(w) for w in cfg.warnings), cfg.warnings


def test_the_urgent_lane_needs_async_scheduling() -> None:
    sets = ["stages.1.codec_urgent_lane_ms=10", "stages.1.async_scheduling=false"]
    with pytest.raises(ConfigError) as info:
        load_deploy_config(QWEN, platform="cuda", overrides=sets)
    assert any(
        "stages[1].codec_urgent_lane_ms: needs async_scheduling: true" in str(i) for i in info.value.issues
    )
    assert load_deploy_config(QWEN, platform="cuda", overrides=sets[:1]).codec.codec_urgent_lane_ms == 10
