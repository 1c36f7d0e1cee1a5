"""``audio8_tts_codec_dtype`` and ``qwen3_tts_codec_dtype`` do what the deploy file says: each sets its
family's codec compute dtype when ``--dtype`` is left at ``auto``, yields to an explicit ``--dtype``, and
other families never read it."""

from __future__ import annotations

from pathlib import Path

import torch

from services.codec.main import _family_dtype
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


def test_the_qwen3_codec_dtype_key() -> None:
    seed = SEED.with_name("qwen3_tts.yaml")
    key = "connectors.connector_of_shared_memory.extra.qwen3_tts_codec_dtype"
    audio8 = ModelSource("audio8-tts-tiny", Path("."), "arktts")
    qwen = ModelSource("qwen3-tts-tiny", Path("."), "qwen3_tts")
    bf16 = load_deploy_config(seed, overrides=[f"{key}=bfloat16"])
    assert _family_dtype(bf16, qwen, "auto", torch.float32) is torch.bfloat16
    assert _family_dtype(bf16, qwen, "float32", torch.float32) is torch.float32  # the flag wins
    assert _family_dtype(bf16, audio8, "auto", torch.float32) is torch.float32  # not this family's key
    unset = load_deploy_config(seed)  # the seed leaves it unset: fp32
    assert _family_dtype(unset, qwen, "auto", torch.float32) is torch.float32
