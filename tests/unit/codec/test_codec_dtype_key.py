"""``audio8_tts_codec_dtype`` and ``qwen3_tts_codec_dtype`` do what the deploy file says: each sets its
family's codec compute dtype when ``--dtype`` is left at ``auto``, yields to an explicit ``--dtype``, and
other families never read it; the seeds serve fp32."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from services.codec.main import _family_dtype
from voxstage.config import load_deploy_config
from voxstage.presets import ModelSource

DEPLOY = Path(__file__).resolve().parents[3] / "deploy"
AUDIO8 = ModelSource("audio8-tts-tiny", Path("."), "arktts")
QWEN = ModelSource("qwen3-tts-tiny", Path("."), "qwen3_tts")


@pytest.mark.parametrize(
    "seed,key,owner,other",
    [
        ("audio8_tts", "audio8_tts_codec_dtype", AUDIO8, QWEN),
        ("qwen3_tts", "qwen3_tts_codec_dtype", QWEN, AUDIO8),
    ],
)
def test_a_family_codec_dtype_key(seed: str, key: str, owner: ModelSource, other: ModelSource) -> None:
    path = DEPLOY / f"{seed}.yaml"
    bf16 = load_deploy_config(path, overrides=[f"connectors.connector_of_shared_memory.extra.{key}=bfloat16"])
    assert _family_dtype(bf16, owner, "auto", torch.float32) is torch.bfloat16
    assert _family_dtype(bf16, owner, "float16", torch.float16) is torch.float16  # the flag wins
    assert _family_dtype(bf16, other, "auto", torch.float32) is torch.float32  # not that family's key
    assert _family_dtype(load_deploy_config(path), owner, "auto", torch.float32) is torch.float32  # seed
