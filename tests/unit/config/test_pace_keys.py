"""``pace_realtime_x`` / ``pace_ahead_s`` / ``pace_from_streams``: defaults and overrides, and the engine's
pacing from them (refusals and the duplex warning: test_stage_owned_keys.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.talker.main import pacing_of
from services.talker.pacing import Pacing
from voxstage.config import load_deploy_config

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
