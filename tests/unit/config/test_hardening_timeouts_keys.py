"""Issue 15: the gateway's timeout and size keys have defaults, ranges, and reach uvicorn."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.http.limits import GuardedH11, http_config
from voxstage.config import ConfigError, load_deploy_config

REPO = Path(__file__).resolve().parents[3]
SEEDS = ("qwen3_tts", "audio8_tts", "personaplex")
DEFAULTS = {
    "stream_idle_timeout_s": 30.0,
    "max_stream_lifetime_s": 3600.0,
    "http_header_timeout_s": 10.0,
    "http_max_header_bytes": 16384,
    "http_body_timeout_s": 10.0,
    "http_keep_alive_timeout_s": 5,
}


@pytest.mark.parametrize("seed", SEEDS)
def test_seeds_get_the_documented_defaults(seed: str) -> None:
    gw = load_deploy_config(REPO / "deploy" / f"{seed}.yaml", platform="cpu").gateway
    assert {key: getattr(gw, key) for key in DEFAULTS} == DEFAULTS


@pytest.mark.parametrize(
    "override",
    [
        "gateway.stream_idle_timeout_s=0",
        "gateway.stream_idle_timeout_s=3601",
        "gateway.max_stream_lifetime_s=0",
        "gateway.max_stream_lifetime_s=86401",  # a day at most: a streaming call may not live forever
        "gateway.duplex_max_session_s=86401",  # nor may a duplex session
        "gateway.http_header_timeout_s=0",
        "gateway.http_header_timeout_s=301",
        "gateway.http_max_header_bytes=1023",
        "gateway.http_max_header_bytes=1048577",
        "gateway.http_body_timeout_s=0",
        "gateway.http_body_timeout_s=301",
        "gateway.http_keep_alive_timeout_s=0",
        "gateway.http_keep_alive_timeout_s=301",
    ],
)
def test_out_of_range_values_are_refused(override: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_deploy_config(REPO / "deploy" / "qwen3_tts.yaml", platform="cpu", overrides=[override])
    assert override.split("=")[0] in str(info.value.issues[0])


def test_http_keys_reach_uvicorn() -> None:
    overrides = [
        "gateway.http_header_timeout_s=2.5",
        "gateway.http_max_header_bytes=4096",
        "gateway.http_body_timeout_s=3.5",
        "gateway.http_keep_alive_timeout_s=7",
    ]
    gw = load_deploy_config(REPO / "deploy" / "qwen3_tts.yaml", platform="cpu", overrides=overrides).gateway
    config = http_config(object(), gw, grace_s=1.0)
    assert config.http is GuardedH11  # h11 always: httptools has no head size limit
    assert config.h11_max_incomplete_event_size == 4096 and config.timeout_keep_alive == 7
    assert config.header_timeout_s == 2.5 and config.app.body_timeout_s == 3.5
    assert (config.app.send_timeout_s, config.app.lifetime_s) == (30.0, 3600.0)  # the stream keys
