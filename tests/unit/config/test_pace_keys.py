"""``pace_realtime_x`` / ``pace_ahead_s`` / ``pace_ride_s`` / ``pace_from_streams``: defaults (the deploy
file's and the family's) and overrides, and the engine's pacing from them (refusals and the duplex warning:
test_stage_owned_keys.py)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from services.talker.main import family_pacing, pacing_of
from services.talker.pacing import Pacing, pacing_warnings
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
    # Riding unset: as far again as the cushion (measured: 3 s past 3 s, docs/benchmarks.md).
    want = Pacing(
        min_step_interval_s=pytest.approx(0.032), ahead_s=3.0, ride_s=3.0, from_streams=32, frame_s=0.08
    )
    assert pacing == want
    for ride_s in (2.5, 0.0):  # 0: a held stream sits every step out
        ride = load_deploy_config(QWEN, platform="cuda", overrides=[*sets, f"stages.0.pace_ride_s={ride_s}"])
        assert pacing_of(ride.talker, 12.5).ride_s == ride_s


def test_settings_that_starve_the_chunk_schedule_are_warned(caplog: pytest.LogCaptureFixture) -> None:
    plan = load_deploy_config(QWEN, platform="cuda").chunk_plan  # 25-frame steady chunks, the ramp on
    bad = ["stages.0.pace_realtime_x=2", "stages.0.pace_ahead_s=1.5"]
    with caplog.at_level(logging.WARNING, logger="services.talker.main"):
        pacing_of(load_deploy_config(QWEN, platform="cuda", overrides=bad).talker, 12.5, plan)
    said = " ".join(r.getMessage() for r in caplog.records)
    assert "pace_ahead_s is 1.5 s, not more than one steady chunk (25 frames, 2 s)" in said
    assert "pace_realtime_x is 2: with the chunk ramp on" in said
    caplog.clear()
    good = ["stages.0.pace_realtime_x=3", "stages.0.pace_ahead_s=3"]
    with caplog.at_level(logging.WARNING, logger="services.talker.main"):
        pacing_of(load_deploy_config(QWEN, platform="cuda", overrides=good).talker, 12.5, plan)
    assert not caplog.records
    # With the ramp off (every chunk a steady one) a speed of 1.5 is no reason to warn: only the cushion is.
    (cushion,) = pacing_warnings(1.0, 1.5, 25, False, 12.5)
    assert cushion.startswith("stages[0].pace_ahead_s is 1 s")


def test_the_family_paces_when_the_deploy_file_does_not() -> None:
    """Qwen3-TTS paces at 3x real time with a 3 s cushion on a GPU (measured: 128 gap-free streams against 96
    unpaced); Audio8 and any CPU stage are unpaced; a pacing key of the deploy file replaces the default, and
    ``pace_realtime_x: 0`` turns it off."""
    default = family_pacing("qwen3_tts", "cuda")
    assert default == (3.0, 3.0)
    assert family_pacing("qwen3_tts", "cpu") is None
    assert family_pacing("audio8_tts", "cuda") is None
    talker = load_deploy_config(QWEN, platform="cuda").talker
    want = Pacing(min_step_interval_s=pytest.approx(0.08 / 3), ahead_s=3.0, ride_s=3.0, from_streams=16)
    assert pacing_of(talker, 12.5, default=default) == want
    off = load_deploy_config(QWEN, platform="cuda", overrides=["stages.0.pace_realtime_x=0"]).talker
    assert not pacing_of(off, 12.5, default=default).on
    hold_only = load_deploy_config(QWEN, platform="cuda", overrides=["stages.0.pace_ride_s=0"]).talker
    assert pacing_of(hold_only, 12.5, default=default).ride_s == 0.0
    own = load_deploy_config(QWEN, platform="cuda", overrides=["stages.0.pace_ahead_s=4"]).talker
    assert pacing_of(own, 12.5, default=default) == Pacing(ahead_s=4.0, ride_s=4.0, from_streams=16)


def test_riding_without_a_cushion_is_said_to_do_nothing(caplog: pytest.LogCaptureFixture) -> None:
    talker = load_deploy_config(QWEN, platform="cuda", overrides=["stages.0.pace_ride_s=2"]).talker
    with caplog.at_level(logging.WARNING, logger="services.talker.main"):
        assert not pacing_of(talker, 12.5, default=family_pacing("qwen3_tts", "cpu")).on
    assert "stages[0].pace_ride_s does nothing" in caplog.text
