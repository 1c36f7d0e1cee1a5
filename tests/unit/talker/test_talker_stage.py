"""Talker stage logic that needs no process: frame credit batching and per-request sampling defaults."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.talker.models import Catalog, CatalogVoice, TalkerInfo
from services.talker.sampling import SamplingParams
from services.talker.takes import sendable
from services.talker.worker import TalkerDefaults, apply_overrides
from voxstage.config import load_deploy_config
from voxstage.stage.errors import StageFailure

SEED = Path(__file__).resolve().parents[3] / "deploy" / "qwen3_tts.yaml"
CHECKPOINT = SamplingParams(do_sample=True, temperature=0.5, top_k=10, top_p=0.8, repetition_penalty=1.2)
CHECKPOINT_SUB = SamplingParams(do_sample=False, temperature=0.3, top_k=5, top_p=0.7, repetition_penalty=1.1)


def info() -> TalkerInfo:
    return TalkerInfo(
        family="qwen3_tts",
        model="m",
        num_code_groups=16,
        frame_rate_hz=12.5,
        voices=("ryan",),
        languages=("auto",),
        variant="custom_voice",
        default_sampling=CHECKPOINT,
        default_subtalker_sampling=CHECKPOINT_SUB,
        max_new_frames=8192,
        max_positions=4096,
        catalog=Catalog(voices=(CatalogVoice("ryan"),), languages=(), voice_required=True),
    )


@pytest.mark.parametrize(
    ("sent", "avail", "credit", "finished", "expected"),
    [
        (0, 0, 51, False, 0),
        (0, 1, 51, False, 1),  # the 1-frame first chunk goes out alone
        (1, 24, 50, False, 0),  # the next boundary is frame 26
        (1, 25, 50, False, 25),
        (1, 60, 50, False, 50),  # everything produced that fits: two whole chunks in one message
        (1, 60, 30, False, 25),
        (1, 25, 24, False, 0),  # never split to fit the credit
        (0, 0, 0, True, 0),
        (1, 23, 50, True, 23),  # the take ended: the remainder goes out
        (1, 30, 26, True, 25),  # remainder larger than the credit: whole chunks first
        (26, 4, 4, True, 4),
    ],
)
def test_frames_are_sent_in_whole_chunks_within_credit(
    sent: int, avail: int, credit: int, finished: bool, expected: int
) -> None:
    assert sendable(sent, avail, credit, 1, 25, finished, ramp=False) == expected


@pytest.mark.parametrize(
    "sent,avail,credit,finished,expected",
    [
        (0, 1, 51, False, 1),  # 1, then chunks of 1, 2, 4, 8, 16, then 25: boundaries 1, 2, 4, 8, 16, 32, 57
        (1, 1, 50, False, 1),  # the chunk after the first audio is a single frame too
        (1, 2, 50, False, 1),
        (1, 13, 50, False, 7),  # three whole chunks (1 + 2 + 4); the 8-frame one is not complete
        (4, 40, 30, False, 28),  # 4 + 8 + 16 fit the credit; the next (25) would not
        (32, 30, 50, False, 25),
        (8, 5, 50, True, 5),  # the take ended: the remainder goes out
    ],
)
def test_ramped_chunks_grow_to_the_steady_size(
    sent: int, avail: int, credit: int, finished: bool, expected: int
) -> None:
    assert sendable(sent, avail, credit, 1, 25, finished) == expected


def test_deploy_sampling_overrides_only_the_keys_the_file_sets() -> None:
    d = TalkerDefaults.from_deploy(load_deploy_config(SEED, platform="cpu").talker, info())
    # The seed sets temperature 0.9, top_k 50, repetition_penalty 1.05; top_p comes from the checkpoint.
    assert d.sampling == SamplingParams(
        do_sample=True, temperature=0.9, top_k=50, top_p=0.8, repetition_penalty=1.05
    )
    # Subtalker: do_sample, temperature, top_k, top_p set; repetition_penalty stays the checkpoint's.
    assert d.subtalker == SamplingParams(
        do_sample=True, temperature=0.9, top_k=50, top_p=1.0, repetition_penalty=1.1
    )
    assert (d.seed, d.max_frames, d.min_frames) == (42, 4096, 0)


def test_deploy_top_k_off_and_greedy_map_to_the_sampler() -> None:
    sets = ["stages.0.default_sampling_params.top_k=-1", "stages.0.default_sampling_params.temperature=0"]
    d = TalkerDefaults.from_deploy(load_deploy_config(SEED, platform="cpu", overrides=sets).talker, info())
    assert d.sampling.top_k == 0 and not d.sampling.do_sample  # -1 (deploy: off) is the sampler's 0
    bare = load_deploy_config(SEED, platform="cpu").talker.model_copy(
        update={"subtalker_sampling_params": None}
    )
    assert TalkerDefaults.from_deploy(bare, info()).subtalker == CHECKPOINT_SUB


def test_request_overrides_validate_and_name_the_field() -> None:
    assert not apply_overrides(CHECKPOINT, {"temperature": 0.0}, "sampling").do_sample
    assert apply_overrides(CHECKPOINT, {"top_k": 0}, "sampling").top_k == 0
    assert apply_overrides(CHECKPOINT, {}, "sampling") is CHECKPOINT
    with pytest.raises(StageFailure, match="sampling: top_p") as err:
        apply_overrides(CHECKPOINT, {"top_p": 2.0}, "sampling")
    assert err.value.code == "INVALID_ARGUMENT"
