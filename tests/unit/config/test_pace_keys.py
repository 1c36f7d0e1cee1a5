"""``pace_realtime_x`` / ``pace_ahead_s`` / ``pace_from_streams``: the talker stage's keys, refused on the
codec, checked in range, inert (with a warning) on duplex sessions; and the engine's pacing from them."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.talker.main import pacing_of
from services.talker.pacing import Pacing
from voxstage.config import ConfigError, load_deploy_config

REPO = Path(__file__).resolve().parents[3]
QWEN = REPO / "deploy" / "qwen3_tts.yaml"


def test_off_by_default_and_set_by_override() -> None:
    talker = load_deploy_config(QWEN, platform="cuda").talker
    assert (talker.pace_realtime_x, talker.pace_ahead_s, talker.pace_from_streams) == (None, None, 16)
    assert not pacing_of(talker, 12.5).on
    sets = ["stages.0.pace_realtime_x=2.5", "stages.0.pace_ahead_s=3", "stages.0.pace_from_streams=32"]
    talker = load_deploy_config(QWEN, platform="cuda", overrides=sets).talker
    assert (talker.pace_realtime_x, talker.pace_ahead_s, talker.pace_from_streams) == (2.5, 3.0, 32)
    pacing = pacing_of(talker, 12.5)
    # An 80 ms frame / 2.5: a step every 32 ms at the most.
    want = Pacing(min_step_interval_s=pytest.approx(0.032), ahead_s=3.0, from_streams=32, frame_s=0.08)
    assert pacing == want


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("stages.1.pace_realtime_x=2", "stages[1].pace_realtime_x: belongs to the talker stage (stage_id 0)"),
        ("stages.1.pace_from_streams=8", "stages[1].pace_from_streams: belongs to the talker stage"),
        ("stages.0.pace_realtime_x=0.5", "stages[0].pace_realtime_x"),
        ("stages.0.pace_from_streams=0", "stages[0].pace_from_streams"),
        ("stages.1.pace_ahead_s=3", "stages[1].pace_ahead_s: belongs to the talker stage"),
        ("stages.0.pace_ahead_s=0", "stages[0].pace_ahead_s"),
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
