"""``audio8_tts_codec_dtype`` does what the deploy file says: it sets the Audio8 codec's compute dtype when
``--dtype`` is left at ``auto``, yields to an explicit ``--dtype``, and other families never read it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from voxstage.codec.main import _family_dtype
from voxstage.config import load_deploy_config
from voxstage.presets import ModelSource

SEED = Path(__file__).resolve().parents[3] / "deploy" / "audio8_tts.yaml"
KEY = "connectors.connector_of_shared_memory.extra.audio8_tts_codec_dtype"


def test_the_audio8_codec_dtype_key() -> None:
    audio8 = ModelSource("audio8-tts-tiny", Path("."), "arktts")
    qwen = ModelSource("qwen3-tts-tiny", Path("."), "qwen3_tts")
    bf16 = load_deploy_config(SEED, overrides=[f"{KEY}=bfloat16"])
    assert _family_dtype(bf16, audio8, "auto", torch.float32) is torch.bfloat16
    assert _family_dtype(bf16, audio8, "float16", torch.float16) is torch.float16  # the flag wins
    assert _family_dtype(bf16, qwen, "auto", torch.float32) is torch.float32  # not this family's key
    assert _family_dtype(load_deploy_config(SEED), audio8, "auto", torch.bfloat16) is torch.float32  # seed


def test_build_engine_takes_the_tick_policy_from_the_deploy_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from voxstage.codec.main import build_engine
    from voxstage.codec.models import load_codec
    from voxstage.codec.tick_plan import TickPolicy
    from voxstage.presets import resolve_model

    monkeypatch.setenv("VOXSTAGE_CACHE", str(tmp_path))
    seed = SEED.with_name("qwen3_tts.yaml")
    extra = "connectors.connector_of_shared_memory.extra."
    runtime = load_codec(resolve_model("qwen3-tts-tiny"), max_streams=10)  # the seed's codec max_num_seqs
    assert build_engine(load_deploy_config(seed), runtime, "cpu").policy == TickPolicy("deadline", 400, 0.25)
    tuned = load_deploy_config(
        seed, overrides=[f"{extra}codec_tick_frames=100", f"{extra}codec_deadline_slack_ms=50"]
    )
    assert build_engine(tuned, runtime, "cpu").policy == TickPolicy("deadline", 100, 0.05)
    fifo = load_deploy_config(seed, overrides=[f"{extra}codec_schedule=fifo"])
    assert build_engine(fifo, runtime, "cpu").policy.mode == "fifo"
