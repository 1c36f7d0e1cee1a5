"""``--set`` overrides and platform overlays: applied in the documented order and validated like file keys."""

from __future__ import annotations

from pathlib import Path

import pytest

from voxstage.config import ConfigError, load_deploy_config, parse_deploy_config

REPO = Path(__file__).resolve().parents[3]
QWEN = REPO / "deploy" / "qwen3_tts.yaml"


def test_override_sets_typed_values() -> None:
    cfg = load_deploy_config(
        QWEN,
        platform="cuda",
        overrides=[
            "stages.0.max_num_seqs=4",
            "stages.1.devices=1",  # a YAML int, accepted as one GPU index
            "stages.0.default_sampling_params.temperature=0.5",
            "connectors.connector_of_shared_memory.extra.decode_cudagraph_capture_sizes=[25, 97]",
            "gateway.max_queue=8",  # creates the gateway section the seed lacks
            "model=./checkpoints/qwen3-tts-0.6b",
        ],
    )
    assert cfg.talker.max_num_seqs == 4
    assert cfg.codec.devices == "1" and cfg.codec.device_ids == (1,)
    assert cfg.talker.default_sampling_params.temperature == pytest.approx(0.5)
    assert cfg.talker.default_sampling_params.top_k == 50  # merged, not replaced
    assert cfg.stream.decode_cudagraph_capture_sizes == [25, 97]
    assert cfg.gateway.max_queue == 8 and cfg.gateway.grpc_port == 50051
    assert cfg.admission_limit == 4  # follows the talker's slots when max_concurrent_requests is unset
    assert cfg.model_path() == QWEN.parent / "checkpoints" / "qwen3-tts-0.6b"
    assert cfg.overrides[0] == "stages.0.max_num_seqs=4"


def test_stages_are_addressed_by_stage_id_not_position() -> None:
    data = {
        "stages": [
            {"stage_id": 1, "max_num_seqs": 2},
            {"stage_id": 0, "max_num_seqs": 3},
        ]
    }
    cfg = parse_deploy_config(data, platform="cpu", overrides=["stages.0.max_num_seqs=7"])
    assert cfg.talker.max_num_seqs == 7 and cfg.codec.max_num_seqs == 2


def test_override_wins_over_overlay() -> None:
    npu = load_deploy_config(QWEN, platform="npu", overrides=["stages.0.enforce_eager=false"])
    assert npu.talker.enforce_eager is False
    assert load_deploy_config(QWEN, platform="npu").talker.enforce_eager is True


def test_bad_override_value_names_key_and_flag() -> None:
    with pytest.raises(ConfigError) as info:
        load_deploy_config(QWEN, platform="cuda", overrides=["stages.0.max_num_seqs=ten"])
    assert [str(i) for i in info.value.issues] == [
        f"{QWEN}: stages[0].max_num_seqs: Input should be a valid integer, got 'ten' "
        "(from --set stages.0.max_num_seqs=ten)"
    ]


def test_override_of_unknown_key_is_an_error() -> None:
    with pytest.raises(ConfigError) as info:
        load_deploy_config(QWEN, platform="cuda", overrides=["stages.1.max_num_seq=4"])
    (issue,) = info.value.issues
    assert issue.path == "stages[1].max_num_seq"
    assert "unknown key (did you mean 'max_num_seqs'?)" in str(issue)
    assert issue.hint == "from --set stages.1.max_num_seq=4"


def test_override_triggers_semantic_checks() -> None:
    with pytest.raises(ConfigError) as info:
        load_deploy_config(QWEN, platform="cuda", overrides=["stages.0.gpu_memory_utilization=0.9"])
    (issue,) = info.value.issues
    assert issue.path == "stages[0].gpu_memory_utilization" and "sums to 1.2" in issue.message
    assert issue.hint == "from --set stages.0.gpu_memory_utilization=0.9"


def test_gpu_memory_sum_is_enforced_on_gpus_only() -> None:
    # Two talker and two codec replicas of the seed (0.3 each) on GPU 0: 1.2 of the device.
    replicas = ["stages.0.replicas=2", "stages.1.replicas=2"]
    with pytest.raises(ConfigError) as info:
        load_deploy_config(QWEN, platform="cuda", overrides=replicas)
    (issue,) = info.value.issues
    assert issue.path == "stages[0].gpu_memory_utilization" and "sums to 1.2" in issue.message
    # On CPU the fraction sizes nothing: the same replicas load, with a warning for the GPU case.
    cfg = load_deploy_config(QWEN, platform="cpu", overrides=replicas)
    assert (cfg.talker.replica_count, cfg.codec.replica_count) == (2, 2)
    (warning,) = [w for w in cfg.warnings if "sums to" in w.message]
    assert warning.severity == "warning" and "not enforced on cpu" in warning.message


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("stages.5.max_num_seqs=4", "no stage with stage_id 5"),
        ("stages.talker.max_num_seqs=4", "stages are addressed by stage_id"),
        ("max_num_seqs", "expected KEY=VALUE"),
        ("stages..x=1", "expected KEY=VALUE"),
        ("stages.0.max_num_seqs=[1", "value is not valid YAML"),
        ("stages.0.max_num_seqs.x=1", "stages.0.max_num_seqs holds a single value"),
        (
            "connectors.connector_of_shared_memory.extra.decode_cudagraph_capture_sizes.9=1",
            "index 9 is out of range",
        ),
        ("platforms.npu.stages=[]", "cannot edit platforms"),
    ],
)
def test_malformed_overrides(override: str, expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_deploy_config(QWEN, platform="cuda", overrides=[override])
    messages = [str(i) for i in info.value.issues]
    assert any(m.startswith(f"{QWEN}: --set {override!r}: ") and expected in m for m in messages), messages


def test_overlay_merges_mappings_and_replaces_lists() -> None:
    data = {
        "connectors": {"c": {"name": "SharedMemoryConnector", "extra": {"codec_chunk_frames": 25}}},
        "stages": [
            {
                "stage_id": 0,
                "output_connectors": {"to_stage_1": "c"},
                "default_sampling_params": {"temperature": 0.7, "top_k": 50},
            },
            {"stage_id": 1, "input_connectors": {"from_stage_1": "c"}},
        ],
        "platforms": {
            "cpu": {
                "connectors": {"c": {"extra": {"decode_cudagraph_capture_sizes": [4, 8]}}},
                "stages": [{"stage_id": 0, "default_sampling_params": {"temperature": 0.2}}],
            }
        },
    }
    data["stages"][1]["input_connectors"] = {"from_stage_0": "c"}
    cfg = parse_deploy_config(data, platform="cpu")
    assert cfg.stream.codec_chunk_frames == 25 and cfg.stream.decode_cudagraph_capture_sizes == [4, 8]
    sampling = cfg.talker.default_sampling_params
    assert sampling.temperature == pytest.approx(0.2) and sampling.top_k == 50
    base = parse_deploy_config(data, platform="cuda")
    assert base.talker.default_sampling_params.temperature == pytest.approx(0.7)


def test_semantic_error_caused_by_inactive_overlay_is_reported() -> None:
    data = {
        "stages": [{"stage_id": 0}, {"stage_id": 1}],
        "platforms": {"npu": {"stages": [{"stage_id": 1, "gpu_memory_utilization": 0.8}]}},
    }
    with pytest.raises(ConfigError) as info:
        parse_deploy_config(data, source="inline.yaml", platform="cuda")
    (issue,) = info.value.issues
    # The offending value was written by the overlay, so that is where the error points.
    assert issue.path == "platforms.npu.stages[0].gpu_memory_utilization"
    assert "GPU 0 is shared by stage 0 (0.3), stage 1 (0.8)" in issue.message


def test_unknown_platform_flag() -> None:
    with pytest.raises(ConfigError, match="unknown platform 'tpu'"):
        load_deploy_config(QWEN, platform="tpu")
