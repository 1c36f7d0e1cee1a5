"""The three seed deploy files load unchanged, and their keys land where docs/configuration.md says."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from voxstage.config import DeployConfig, StageRole, load_deploy_config
from voxstage.config.describe import describe, summary

REPO = Path(__file__).resolve().parents[3]
SEEDS = REPO.parent / "shared" / "seeds"
NAMES = ("qwen3_tts", "audio8_tts", "personaplex")


@pytest.mark.parametrize("name", NAMES)
def test_seed_is_byte_identical_to_shared_copy(name: str) -> None:
    if not SEEDS.is_dir():
        pytest.skip(f"{SEEDS} is not present in this checkout")
    assert (REPO / "deploy" / f"{name}.yaml").read_bytes() == (SEEDS / f"{name}.yaml").read_bytes()


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("platform", ["cuda", "cpu", "npu"])
def test_seed_loads_on_every_platform(name: str, platform: str) -> None:
    cfg = load_deploy_config(REPO / "deploy" / f"{name}.yaml", platform=platform)
    assert cfg.platform == platform
    assert cfg.talker.role is StageRole.TALKER and cfg.codec.role is StageRole.CODEC
    assert cfg.stream_connector_name == "connector_of_shared_memory"
    assert cfg.shared_memory
    # connector_get_sleep_s is the unit of both waits: 3000 x 0.01 s and 300 x 0.01 s.
    assert cfg.stream.first_chunk_timeout_s == pytest.approx(30.0)
    assert cfg.stream.stall_timeout_s == pytest.approx(3.0)
    # A warning means a key does nothing or caps the deploy; only Audio8's 1-stream codec does the latter.
    expected = ["stages[1].max_num_seqs"] if name == "audio8_tts" else []
    assert [w.path for w in cfg.warnings] == expected


def _load(name: str, platform: str = "cuda") -> DeployConfig:
    return load_deploy_config(REPO / "deploy" / f"{name}.yaml", platform=platform)


def test_qwen3_values_and_npu_overlay() -> None:
    cuda, npu = _load("qwen3_tts"), _load("qwen3_tts", "npu")
    assert cuda.talker.enforce_eager is False  # omitted in the file: documented default
    assert npu.talker.enforce_eager is True  # platforms.npu flips it
    assert npu.codec.enforce_eager is False  # overlay touches stage 0 only
    assert cuda.talker.enable_prefix_caching is True and cuda.codec.enable_prefix_caching is False
    assert cuda.talker.batched_token_budget == 512 and cuda.codec.batched_token_budget == 65536
    assert cuda.stream.decode_cudagraph_capture_sizes == [25, 73, 97, 169, 325]
    sub = cuda.talker.subtalker_sampling_params
    assert sub is not None and sub.do_sample is True and sub.top_k == 50 and not sub.greedy
    assert cuda.talker.default_sampling_params.repetition_penalty == pytest.approx(1.05)
    schedule = cuda.chunk_plan
    assert (schedule.initial_frames, schedule.steady_frames, schedule.left_context_frames) == (1, 25, 72)
    # The ramp (default): chunks of 1, 1, 2, 4, 8, 16 frames, then 25.
    assert schedule.ramp and [n for n in range(1, 80) if schedule.chunk_due(n)] == [1, 2, 4, 8, 16, 32, 57]
    fixed = dataclasses.replace(schedule, ramp=False)
    assert [n for n in range(1, 80) if fixed.chunk_due(n)] == [1, 26, 51, 76]
    assert cuda.session_mode == "turn" and cuda.duplex_max_sessions is None
    assert cuda.admission_limit == 10


def test_audio8_values() -> None:
    cfg = _load("audio8_tts")
    assert cfg.enable_chunked_prefill is False
    assert cfg.talker.max_num_batched_tokens == 2048 == cfg.talker.max_model_len
    assert cfg.stream.audio8_tts_codec_dtype == "float32"
    assert cfg.stream.shm_threshold_bytes == 65536  # omitted in this seed: documented default
    assert cfg.talker.trust_remote_code is False
    assert cfg.talker.default_sampling_params.top_p == pytest.approx(0.9)
    assert cfg.admission_limit == 1  # 4 talker slots, but a single codec stream
    (warning,) = cfg.warnings
    assert "at most 1 run at once and 3 talker slots stay idle" in warning.message
    assert cfg.codec.default_sampling_params.greedy
    assert [n for n in range(1, 60) if cfg.chunk_plan.chunk_due(n)] == [4, 8, 16, 32, 57]  # 4, 4, 8, 16, 25


def test_personaplex_values() -> None:
    cfg = _load("personaplex")
    assert cfg.pipeline == "personaplex"
    assert cfg.session_mode == "duplex" and cfg.duplex_max_sessions == 2
    assert cfg.talker.skip_tokenizer_init and cfg.codec.skip_tokenizer_init
    assert cfg.talker.default_sampling_params.greedy  # temperature 0, top_k 1
    assert cfg.talker.max_model_len == 3000
    assert cfg.codec.enforce_eager is True
    assert cfg.chunk_plan.initial_frames == 1 and cfg.chunk_plan.steady_frames == 5


def test_describe_renders_effective_values() -> None:
    text = describe(_load("qwen3_tts", "npu"))
    assert "platforms.npu applied" in text
    assert "first_chunk_timeout_s: 30.0" in text and "stall_timeout_s: 3.0" in text
    assert "role: talker" in text and "role: codec" in text
    line = summary(_load("personaplex"))
    assert "\n" not in line and "duplex, up to 2 sessions" in line
