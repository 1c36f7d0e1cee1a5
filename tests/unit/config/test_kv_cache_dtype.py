"""``kv_cache_dtype``: vLLM's spellings that mean what voxstage does are accepted, the others refused with the
reason, and the key belongs to the talker stage."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.config.test_config_errors import errors_of, variant
from voxstage.config import load_deploy_config

TALKER = "    max_model_len: 3000\n"  # personaplex.yaml: the talker stage's line, which occurs once


@pytest.mark.parametrize(("value", "canonical"), [("auto", "auto"), ("fp8", "fp8"), ("FP8_E4M3", "fp8")])
def test_accepted_spellings(tmp_path: Path, value: str, canonical: str) -> None:
    path = variant(tmp_path, "personaplex", (TALKER, f"{TALKER}    kv_cache_dtype: {value}\n"))
    assert load_deploy_config(path, platform="cuda").talker.kv_cache_dtype == canonical


def test_default_is_auto(tmp_path: Path) -> None:
    assert load_deploy_config(variant(tmp_path, "qwen3_tts"), platform="cuda").talker.kv_cache_dtype == "auto"


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("fp8_e5m2", "stages[0].kv_cache_dtype: 'fp8_e5m2' is not supported: it e5m2 keeps 2 "),
        ("fp8_inc", "is Intel Gaudi's fp8 cache"),
        ("bfloat16", "auto always stores the model dtype"),
        ("int8", "stages[0].kv_cache_dtype: must be one of auto, fp8, fp8_e4m3, got 'int8'"),
    ],
)
def test_refused_spellings_name_the_key_and_the_reason(tmp_path: Path, value: str, expected: str) -> None:
    path = variant(tmp_path, "personaplex", (TALKER, f"{TALKER}    kv_cache_dtype: {value}\n"))
    messages = errors_of(path)
    assert any(expected in m for m in messages), messages


CODEC = "    max_model_len: 65536\n"  # personaplex.yaml: the codec stage's line


def test_the_codec_stage_refuses_it(tmp_path: Path) -> None:
    path = variant(tmp_path, "personaplex", (CODEC, f"{CODEC}    kv_cache_dtype: fp8\n"))
    expected = "stages[1].kv_cache_dtype: belongs to the talker stage (stage_id 0)"
    messages = errors_of(path)
    assert any(expected in m for m in messages), messages
