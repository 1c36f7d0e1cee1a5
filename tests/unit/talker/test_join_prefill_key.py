"""``duplex_session.join_prefill_ms`` reaches the duplex talker's engine (a key that is accepted does
something), and a bad value is refused naming it."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from services.talker.main import build
from voxstage import families
from voxstage.config import ConfigError, DuplexSessionConfig, load_deploy_config
from voxstage.stage.process import add_stage_options

ROOT = Path(__file__).resolve().parents[3]
DUPLEX = next(f for f in families.families() if f.duplex)
DEPLOY = ROOT / DUPLEX.deploy_file
TINY = next(p.name for p in DUPLEX.presets if not p.random_init)


def talker_args(*extra: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_stage_options(parser, default_port=0)
    return parser.parse_args(["--config", str(DEPLOY), "--model", TINY, "--device", "cpu", *extra])


def test_the_key_sets_the_engines_prefill_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VOXSTAGE_CACHE", str(tmp_path / "cache"))
    parts = build(talker_args("--set", "duplex_session.join_prefill_ms=7.5"))
    worker = parts.servicer.worker  # type: ignore[attr-defined]
    assert worker.engine.cfg.prefill_time_s == pytest.approx(0.0075)


def test_the_engines_default_is_the_keys() -> None:
    from services.talker.duplex.engine import DuplexConfig

    assert DuplexConfig(max_sessions=1, window=8, prefill_budget=8).prefill_time_s == pytest.approx(
        DuplexSessionConfig().join_prefill_ms / 1e3
    )


@pytest.mark.parametrize("value", ["0", "-1", "1001"])
def test_a_bad_value_is_refused_naming_the_key(value: str) -> None:
    with pytest.raises(ConfigError, match="join_prefill_ms"):
        load_deploy_config(DEPLOY, platform="cpu", overrides=[f"duplex_session.join_prefill_ms={value}"])
