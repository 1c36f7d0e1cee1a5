"""Broken variants of the seed files fail with messages that name the file, the key path and the line."""

from __future__ import annotations

from pathlib import Path

import pytest

from voxstage.config import ConfigError, DeployConfig, load_deploy_config, parse_deploy_config

REPO = Path(__file__).resolve().parents[3]


def variant(tmp_path: Path, seed: str, *edits: tuple[str, str]) -> Path:
    """The seed file with each ``old`` text replaced once by ``new`` (so everything else stays identical)."""
    text = (REPO / "deploy" / f"{seed}.yaml").read_text()
    for old, new in edits:
        assert text.count(old) == 1, f"edit anchor {old!r} must occur exactly once in {seed}.yaml"
        text = text.replace(old, new)
    path = tmp_path / f"{seed}_variant.yaml"
    path.write_text(text)
    return path


def errors_of(path: Path, **kwargs: object) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_deploy_config(path, platform="cuda", **kwargs)  # type: ignore[arg-type]
    return [str(issue) for issue in info.value.issues]


def line_of(path: Path, needle: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if needle in line)


def test_unknown_top_level_key(tmp_path: Path) -> None:
    path = variant(tmp_path, "qwen3_tts", ("async_chunk: true\n", "async_chunk: true\nasync_chunks: true\n"))
    (msg,) = errors_of(path)
    assert msg.startswith(f"{path}: async_chunks: unknown key (did you mean 'async_chunk'?)")
    assert msg.endswith(f"(line {line_of(path, 'async_chunks')})")


def test_unknown_stage_key(tmp_path: Path) -> None:
    path = variant(
        tmp_path, "audio8_tts", ("    max_num_seqs: 4\n", "    max_num_seqs: 4\n    max_num_seq: 4\n")
    )
    (msg,) = errors_of(path)
    assert f"{path}: stages[0].max_num_seq: unknown key (did you mean 'max_num_seqs'?)" in msg


def test_unknown_key_inside_extra(tmp_path: Path) -> None:
    # decode_batch_max_size exists in newer vllm-omni files; voxstage does not know it and must say so.
    path = variant(
        tmp_path,
        "qwen3_tts",
        ("      codec_chunk_frames: 25\n", "      codec_chunk_frames: 25\n      decode_batch_max_size: 4\n"),
    )
    (msg,) = errors_of(path)
    assert msg.startswith(
        f"{path}: connectors.connector_of_shared_memory.extra.decode_batch_max_size: unknown key"
    )
    assert f"(line {line_of(path, 'decode_batch_max_size')})" in msg


def test_string_where_a_number_belongs(tmp_path: Path) -> None:
    path = variant(tmp_path, "audio8_tts", ("    max_num_seqs: 4\n", "    max_num_seqs: ten\n"))
    (msg,) = errors_of(path)
    assert msg.startswith(f"{path}: stages[0].max_num_seqs: Input should be a valid integer, got 'ten'")


def test_quoted_number_is_not_coerced(tmp_path: Path) -> None:
    path = variant(
        tmp_path, "audio8_tts", ("    gpu_memory_utilization: 0.2\n", '    gpu_memory_utilization: "0.2"\n')
    )
    (msg,) = errors_of(path)
    assert "stages[0].gpu_memory_utilization: Input should be a valid number, got '0.2'" in msg


def test_every_problem_is_reported_at_once(tmp_path: Path) -> None:
    path = variant(
        tmp_path,
        "personaplex",
        ("pipeline: personaplex\n", "pipeline: personaplex\nbogus: 1\n"),
        (
            "    max_num_seqs: 10\n    gpu_memory_utilization: 0.4\n",
            "    max_num_seqs: 0\n    gpu_memory_utilization: 0.4\n",
        ),
        ("      top_k: 1\n", "      top_k: one\n"),
    )
    messages = errors_of(path)
    assert len(messages) == 3
    assert any("bogus: unknown key" in m for m in messages)
    assert any(
        "stages[0].max_num_seqs: Input should be greater than or equal to 1, got 0" in m for m in messages
    )
    assert any("stages[0].default_sampling_params.top_k" in m for m in messages)


def test_missing_codec_stage(tmp_path: Path) -> None:
    text = (REPO / "deploy" / "audio8_tts.yaml").read_text()
    path = tmp_path / "no_codec.yaml"
    path.write_text(text[: text.index("  - stage_id: 1")])
    messages = errors_of(path)
    assert any(m.startswith(f"{path}: stages: no codec stage: add a stage with stage_id 1") for m in messages)
    # The talker still names the codec as its edge's far end, which no longer exists.
    assert any("stages[0].output_connectors.to_stage_1: edge 0 -> 1 refers to stage 1" in m for m in messages)


def test_missing_talker_stage(tmp_path: Path) -> None:
    path = variant(tmp_path, "qwen3_tts", ("stages:\n  - stage_id: 0\n", "stages:\n  - stage_id: 2\n"))
    messages = errors_of(path)
    assert any(f"{path}: stages: no talker stage: add a stage with stage_id 0" in m for m in messages)
    assert any("stages[0].stage_id: stage_id 2 has no role" in m for m in messages)


def test_edge_to_missing_stage(tmp_path: Path) -> None:
    path = variant(tmp_path, "qwen3_tts", ("to_stage_1: connector", "to_stage_3: connector"))
    messages = errors_of(path)
    assert any(
        m.startswith(f"{path}: stages[0].output_connectors.to_stage_3: edge 0 -> 3 refers to stage 3")
        and f"(line {line_of(path, 'to_stage_3')})" in m
        for m in messages
    )


def test_edge_with_unknown_connector(tmp_path: Path) -> None:
    path = variant(tmp_path, "personaplex", ("from_stage_0: connector_of_shared_memory", "from_stage_0: shm"))
    messages = errors_of(path)
    expected = "stages[1].input_connectors.from_stage_0: unknown connector 'shm'"
    assert any(expected in m and "(connectors: connector_of_shared_memory)" in m for m in messages)


def test_edge_keys_are_spelled_with_stage_ids(tmp_path: Path) -> None:
    path = variant(tmp_path, "personaplex", ("to_stage_1: connector", "to_codec: connector"))
    messages = errors_of(path)
    assert any(
        "stages[0].output_connectors.to_codec: edge keys in output_connectors are spelled" in m
        for m in messages
    )


def test_unknown_connector_kind(tmp_path: Path) -> None:
    path = variant(tmp_path, "audio8_tts", ("name: SharedMemoryConnector", "name: MooncakeStoreConnector"))
    (msg,) = errors_of(path)
    assert (
        "connectors.connector_of_shared_memory.name: unknown connector kind 'MooncakeStoreConnector'" in msg
    )


def test_overlay_with_unknown_key_fails_on_every_platform(tmp_path: Path) -> None:
    path = variant(
        tmp_path, "personaplex", ("        enforce_eager: false\n", "        enforce_eagre: false\n")
    )
    msg = f"{path}: platforms.npu.stages[0].enforce_eagre: unknown key (did you mean 'enforce_eager'?)"
    for platform in ("cuda", "npu"):
        with pytest.raises(ConfigError) as info:
            load_deploy_config(path, platform=platform)
        (issue,) = info.value.issues
        assert str(issue).startswith(msg) and issue.line == line_of(path, "enforce_eagre")


def test_overlay_with_wrong_type(tmp_path: Path) -> None:
    path = variant(
        tmp_path, "qwen3_tts", ("        enforce_eager: true\n", "        enforce_eager: yes please\n")
    )
    (msg,) = errors_of(path)
    assert msg == (
        f"{path}: platforms.npu.stages[0].enforce_eager: Input should be a valid boolean, got 'yes please' "
        f"(line {line_of(path, 'yes please')})"
    )


def test_overlay_for_unknown_stage(tmp_path: Path) -> None:
    path = variant(
        tmp_path,
        "qwen3_tts",
        ("      - stage_id: 0\n        enforce_eager", "      - stage_id: 7\n        enforce_eager"),
    )
    (msg,) = errors_of(path)
    assert msg.startswith(
        f"{path}: platforms.npu.stages[0].stage_id: no stage with stage_id 7 in the base file"
    )


def test_unknown_platform_name(tmp_path: Path) -> None:
    path = variant(tmp_path, "qwen3_tts", ("  npu:\n", "  nup:\n"))
    (msg,) = errors_of(path)
    assert msg.startswith(f"{path}: platforms.nup: invalid key: Input should be 'cuda', 'cpu'")


@pytest.mark.parametrize(
    ("seed", "old", "new", "expected"),
    [
        (
            "qwen3_tts",
            "initial_codec_chunk_frames: 1",
            "initial_codec_chunk_frames: 30",
            "connectors.connector_of_shared_memory.extra: initial_codec_chunk_frames (30) must not exceed "
            "codec_chunk_frames (25)",
        ),
        (
            "qwen3_tts",
            "[25, 73, 97, 169, 325]",
            "[25, 97, 73]",
            "extra.decode_cudagraph_capture_sizes: sizes must be sorted ascending without repeats",
        ),
        ("qwen3_tts", "[25, 73, 97, 169, 325]", "[0, 25]", "sizes must be positive frame counts"),
        (
            "audio8_tts",
            "gpu_memory_utilization: 0.2",
            "gpu_memory_utilization: 1.5",
            "less than or equal to 1",
        ),
        ("audio8_tts", "gpu_memory_utilization: 0.2", "gpu_memory_utilization: 0", "greater than 0"),
        (
            "personaplex",
            "gpu_memory_utilization: 0.4",
            "gpu_memory_utilization: 0.8",
            "stages[0].gpu_memory_utilization: GPU 0 is shared by stage 0 (0.8), stage 1 (0.3): "
            "gpu_memory_utilization sums to 1.1",
        ),
        (
            "audio8_tts",
            '    devices: "0"\n    output',
            '    devices: "0,a"\n    output',
            "non-negative GPU indices",
        ),
        (
            "audio8_tts",
            '    devices: "0"\n    output',
            '    devices: "1,1"\n    output',
            "lists a GPU index twice",
        ),
        ("audio8_tts", "      top_k: 50", "      top_k: 0", "top_k: must be -1 (off) or a positive integer"),
        (
            "qwen3_tts",
            "codec_streaming: true",
            "codec_streaming: false",
            "set by the top-level async_chunk key",
        ),
        (
            "audio8_tts",
            '    max_num_batched_tokens: 2048\n    devices: "0"\n    output',
            '    max_num_batched_tokens: 1024\n    devices: "0"\n    output',
            "stages[0].max_num_batched_tokens: is 1024 but must be >= max_model_len (2048)",
        ),
        (
            "qwen3_tts",
            "async_chunk: true\n",
            "async_chunk: true\nduplex_session:\n  max_sessions: 2\n",
            "duplex_session: is only valid with session_mode: duplex",
        ),
        (
            "personaplex",
            "  max_sessions: 2",
            "  max_sessions: 11",
            "duplex_session.max_sessions: is 11 but each",
        ),
        (
            "personaplex",
            "    enable_prefix_caching: false\n    async_scheduling: true\n    max_num_batched_tokens: 512",
            "    enable_prefix_caching: true\n    async_scheduling: true\n    max_num_batched_tokens: 512",
            "stages[0].enable_prefix_caching: must be false for personaplex",
        ),
        (
            "personaplex",
            "pipeline: personaplex",
            "pipeline: qwen3_tts",
            "session_mode: duplex needs a full-duplex",
        ),
    ],
)
def test_semantic_rules(tmp_path: Path, seed: str, old: str, new: str, expected: str) -> None:
    path = variant(tmp_path, seed, (old, new))
    messages = errors_of(path)
    assert any(expected in m and m.startswith(f"{path}: ") for m in messages), messages


def test_chunked_prefill_off_needs_max_model_len() -> None:
    data = {"enable_chunked_prefill": False, "stages": [{"stage_id": 0}, {"stage_id": 1}]}
    with pytest.raises(ConfigError) as info:
        parse_deploy_config(data, source="inline.yaml", platform="cpu")
    assert [str(i) for i in info.value.issues] == [
        "inline.yaml: stages[0].max_model_len: must be set when enable_chunked_prefill is false: a prompt is "
        "then prefilled in one tick, and max_num_batched_tokens is checked against this length"
    ]


def test_yaml_syntax_error_names_file_and_line(tmp_path: Path) -> None:
    path = variant(tmp_path, "audio8_tts", ("    max_num_seqs: 4\n", "    max_num_seqs: [4\n"))
    (msg,) = errors_of(path)
    assert msg.startswith(f"{path}: invalid YAML:") and "(line " in msg


def test_duplicate_key_is_rejected(tmp_path: Path) -> None:
    path = variant(
        tmp_path, "audio8_tts", ("    max_num_seqs: 4\n", "    max_num_seqs: 4\n    max_num_seqs: 8\n")
    )
    (msg,) = errors_of(path)
    first = line_of(path, "max_num_seqs: 4")
    assert f"duplicate key 'max_num_seqs' (first defined on line {first})" in msg
    assert msg.endswith(f"(line {first + 1})")


@pytest.mark.parametrize(("content", "expected"), [("", "the file is empty"), ("- 1\n", "must be a mapping")])
def test_empty_or_non_mapping_file(tmp_path: Path, content: str, expected: str) -> None:
    path = tmp_path / "odd.yaml"
    path.write_text(content)
    (msg,) = errors_of(path)
    assert msg.startswith(f"{path}: ") and expected in msg


def test_missing_file(tmp_path: Path) -> None:
    (msg,) = errors_of(tmp_path / "nope.yaml")
    assert msg == f"{tmp_path / 'nope.yaml'}: file not found"


def test_direct_model_validation_applies_cross_checks() -> None:
    # Bypassing the loader must not bypass the graph checks.
    with pytest.raises(ConfigError, match="no codec stage"):
        DeployConfig.model_validate({"stages": [{"stage_id": 0}]})


def test_warnings_name_keys_that_do_nothing(tmp_path: Path) -> None:
    path = variant(
        tmp_path,
        "personaplex",
        (
            "      initial_codec_chunk_frames: 1\n",
            "      initial_codec_chunk_frames: 1\n      decode_cudagraph_capture_sizes: [5]\n",
        ),
    )
    cfg = load_deploy_config(path, platform="cuda")
    (warning,) = cfg.warnings
    assert warning.path == "connectors.connector_of_shared_memory.extra.decode_cudagraph_capture_sizes"
    assert "enforce_eager: true" in warning.message and warning.line == line_of(path, "decode_cudagraph")


def test_duplex_session_clocks_of_the_gateway() -> None:
    seed = REPO / "deploy" / "personaplex.yaml"
    cfg = load_deploy_config(seed, platform="cpu")
    assert (cfg.gateway.duplex_idle_timeout_s, cfg.gateway.duplex_max_session_s) == (30.0, 3600.0)
    with pytest.raises(ConfigError) as info:
        load_deploy_config(seed, platform="cpu", overrides=["gateway.duplex_idle_timeout_s=0"])
    assert "gateway.duplex_idle_timeout_s" in str(info.value.issues[0])
    clocks = ["gateway.duplex_idle_timeout_s=90", "gateway.duplex_max_session_s=60"]
    longer = load_deploy_config(seed, platform="cpu", overrides=clocks)
    assert [w.path for w in longer.warnings] == ["gateway.duplex_idle_timeout_s"]
    turn = load_deploy_config(
        REPO / "deploy" / "qwen3_tts.yaml", platform="cpu", overrides=["gateway.duplex_max_session_s=60"]
    )
    (warning,) = turn.warnings
    assert warning.path == "gateway.duplex_max_session_s" and "no duplex session" in warning.message
