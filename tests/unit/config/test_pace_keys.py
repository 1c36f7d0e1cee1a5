"""``pace_realtime_x`` / ``pace_from_streams``: the talker stage's keys, refused on the codec, checked in
range, inert (with a warning) on duplex sessions; and the talker turns them into its step interval."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.talker.main import pace_interval_s
from voxstage.config import ConfigError, load_deploy_config

REPO = Path(__file__).resolve().parents[3]
QWEN = REPO / "deploy" / "qwen3_tts.yaml"


def test_off_by_default_and_set_by_override() -> None:
    talker = load_deploy_config(QWEN, platform="cuda").talker
    assert (talker.pace_realtime_x, talker.pace_from_streams) == (None, 16)
    assert pace_interval_s(talker.pace_realtime_x, 12.5) == 0.0
    sets = ["stages.0.pace_realtime_x=2.5", "stages.0.pace_from_streams=32"]
    talker = load_deploy_config(QWEN, platform="cuda", overrides=sets).talker
    assert (talker.pace_realtime_x, talker.pace_from_streams) == (2.5, 32)
    assert pace_interval_s(talker.pace_realtime_x, 12.5) == pytest.approx(0.032)  # an 80 ms frame / 2.5


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("stages.1.pace_realtime_x=2", "stages[1].pace_realtime_x: belongs to the talker stage (stage_id 0)"),
        ("stages.1.pace_from_streams=8", "stages[1].pace_from_streams: belongs to the talker stage"),
        ("stages.0.pace_realtime_x=0.5", "stages[0].pace_realtime_x"),
        ("stages.0.pace_from_streams=0", "stages[0].pace_from_streams"),
    ],
)
def test_misplaced_or_bad_values_are_refused_naming_the_key(override: str, expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_deploy_config(QWEN, platform="cuda", overrides=[override])
    assert any(expected in str(issue) for issue in info.value.issues), info.value.issues


def test_duplex_sessions_warn_that_the_keys_do_nothing() -> None:
    path = REPO / "deploy" / "personaplex.yaml"
    cfg = load_deploy_config(path, platform="cuda", overrides=["stages.0.pace_realtime_x=3"])
    assert any("pace_realtime_x" in str(w) and "duplex" in str(w) for w in cfg.warnings), cfg.warnings
