"""The load-time hook that checks the chunk settings against the loaded codec's window."""

from __future__ import annotations

from pathlib import Path

import pytest

from voxstage.config import (
    ConfigError,
    DeployConfig,
    check_codec_against_model,
    load_deploy_config,
    raise_for_errors,
)

REPO = Path(__file__).resolve().parents[3]


def _load(name: str, *overrides: str) -> DeployConfig:
    return load_deploy_config(REPO / "deploy" / f"{name}.yaml", platform="cuda", overrides=overrides)


def test_qwen3_stateful_with_matching_window_is_clean() -> None:
    issues = check_codec_against_model(
        _load("qwen3_tts"), decoder_window_frames=72, stateful=True, num_codebooks=16
    )
    assert issues == []


def test_stateful_codec_flags_a_left_context_that_does_nothing() -> None:
    (issue,) = check_codec_against_model(_load("personaplex"), decoder_window_frames=250, stateful=True)
    assert issue.severity == "warning"
    assert issue.path == "connectors.connector_of_shared_memory.extra.codec_left_context_frames"
    assert "carries its own 250-frame history" in issue.message
    assert raise_for_errors([issue]) == [issue]


def test_stateless_codec_below_window_warns() -> None:
    (issue,) = check_codec_against_model(_load("audio8_tts"), decoder_window_frames=128, stateful=False)
    assert issue.severity == "warning" and "is 25, below the decoder window of 128 frames" in issue.message


def test_stateless_codec_without_left_context_is_an_error() -> None:
    cfg = _load("audio8_tts", "connectors.connector_of_shared_memory.extra.codec_left_context_frames=0")
    issues = check_codec_against_model(cfg, decoder_window_frames=128, stateful=False)
    with pytest.raises(ConfigError, match="must be > 0 for this stateless codec"):
        raise_for_errors(issues)


def test_chunk_larger_than_codec_token_budget_is_an_error() -> None:
    cfg = _load("audio8_tts", "stages.1.max_num_batched_tokens=400")
    # 10 codebooks x (25 left context + 25 new) frames = 500 codec tokens in one stateless chunk.
    (issue,) = [
        i
        for i in check_codec_against_model(cfg, decoder_window_frames=25, stateful=False, num_codebooks=10)
        if i.severity == "error"
    ]
    assert issue.path == "stages[1].max_num_batched_tokens"
    assert "10 codebooks x 50 frames = 500 codec tokens" in issue.message


def test_steady_chunk_beyond_largest_graph_bucket_warns() -> None:
    cfg = _load(
        "qwen3_tts", "connectors.connector_of_shared_memory.extra.decode_cudagraph_capture_sizes=[25, 73]"
    )
    (issue,) = check_codec_against_model(cfg, decoder_window_frames=72, stateful=False)
    assert (
        issue.path.endswith("decode_cudagraph_capture_sizes")
        and "decodes 97: those run eager" in issue.message
    )


def test_negative_window_is_a_programming_error() -> None:
    with pytest.raises(ValueError, match="decoder_window_frames"):
        check_codec_against_model(_load("qwen3_tts"), decoder_window_frames=-1, stateful=True)
