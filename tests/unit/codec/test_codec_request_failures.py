"""A failure belongs to its request (issue 26), in the codec's engines: a decode (or a duplex tick's encode)
that raises ends the streams it was working on, which ``recover`` names and frees; the other streams decode
on and their audio equals the offline decode. The fault is injected into the real tiny decoders.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from codec_duplex_kit import make_rig, speech
from test_engine import codes_for, make_engine, offline

from services.codec.engine import CodecOutput
from services.codec.models.mimi.loader import random_init as mimi_init
from services.codec.models.mimi.presets import tiny_config
from services.codec.models.qwen3_tts.decoder import Qwen3TokenizerDecoder
from services.codec.models.qwen3_tts.loader import random_init
from services.codec.models.qwen3_tts.presets import decoder_preset
from tests.engine_faults import step_or_recover

TOL = 1e-5


@pytest.fixture(scope="module")
def model() -> Qwen3TokenizerDecoder:
    return random_init(decoder_preset("qwen3-tts-tiny"), seed=0)


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_a_failing_decode_ends_its_streams_and_the_others_equal_the_offline_decode(
    model: Qwen3TokenizerDecoder, async_scheduling: bool
) -> None:
    engine = make_engine(model, streams=3, async_scheduling=async_scheduling)
    codes = {sid: codes_for(i, 30) for i, sid in enumerate("abc")}
    for sid in "abc":
        engine.open(sid)
    bad_slot = engine._streams["b"].slot  # noqa: SLF001 - the stream whose decodes fail
    real = engine.calls

    def faulty(c: torch.Tensor, slots: torch.Tensor, n: torch.Tensor) -> Any:
        if bad_slot in slots.tolist():
            raise ValueError("decode: injected failure")
        return real(c, slots, n)

    engine.calls = faulty  # type: ignore[assignment]
    out: dict[str, list[CodecOutput]] = {}
    failed: list[str] = []
    # b runs on its own bucket (a 7-frame first chunk against a and c's one frame), so only b's decode fails.
    engine.push("b", codes["b"][:7])
    engine._streams["b"].initial_frames = 7  # noqa: SLF001
    for tick in range(200):
        for sid in "ac":
            if tick < 30:
                engine.push(sid, codes[sid][tick : tick + 1])
                if tick == 29:
                    engine.finish(sid)
        outputs, ended = step_or_recover(engine)
        failed += ended
        for o in outputs:
            out.setdefault(o.stream_id, []).append(o)
        if tick > 30 and not engine.has_work():
            break
    assert failed == ["b"] and "b" not in out
    assert engine.active() == 0
    for sid in "ac":
        pcm = np.concatenate([o.pcm for o in out[sid]])
        np.testing.assert_allclose(pcm, offline(model, codes[sid]), atol=TOL, rtol=0)


def test_a_duplex_tick_whose_encode_fails_ends_its_sessions_and_the_engine_ticks_on() -> None:
    rig = make_rig(mimi_init(tiny_config(), seed=5), sessions=2)
    rig.engine.join("a")
    rig.engine.start("a")
    real = rig.calls.encode

    def faulty(pcm: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        raise ValueError("encode: injected failure")

    rig.calls.encode = faulty  # type: ignore[method-assign]
    with pytest.raises(ValueError) as err:
        rig.tick()
    assert rig.engine.recover(err.value) == (["a"], []) and rig.engine.sessions() == 0
    rig.calls.encode = real  # type: ignore[method-assign]
    rig.engine.join("b")
    rig.engine.start("b")
    rig.engine.push_audio("b", speech(1, 1), 0)
    rig.tick()
    assert [u.source_frame for u in rig.user["b"]] == [0]
