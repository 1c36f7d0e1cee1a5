"""Segment marks in the codec engine: decodes stop at each mark, the schedule starts afresh after it, a
segment with no frames (or one that ended on a chunk boundary) still reports its end, and the audio of the
whole stream equals the offline decode of all its frames (the decoder's state runs on across segments)."""

from __future__ import annotations

import numpy as np
import pytest

from services.codec.engine import CodecOutput
from services.codec.models.qwen3_tts.decoder import Qwen3TokenizerDecoder
from services.codec.models.qwen3_tts.loader import random_init
from services.codec.models.qwen3_tts.presets import decoder_preset
from tests.unit.codec.test_engine import SPF, TOL, codes_for, make_engine, offline


@pytest.fixture(scope="module")
def model() -> Qwen3TokenizerDecoder:
    return random_init(decoder_preset("qwen3-tts-tiny"), seed=0)


def run(engine, sid: str, steps: list[tuple[str, int]]) -> list[CodecOutput]:  # type: ignore[no-untyped-def]
    """Apply ('push', n) / ('mark', 0) / ('end', 0) / ('tick', 0) steps; returns every output of ``sid``."""
    rng_seed = iter(range(1000))
    outs: list[CodecOutput] = []
    for kind, n in steps:
        if kind == "push":
            engine.push(sid, codes_for(next(rng_seed), n))
        elif kind == "mark":
            engine.end_segment(sid)
        elif kind == "end":
            engine.finish(sid)
        else:
            outs += [o for o in engine.step() if o.stream_id == sid]
    while engine.has_work():
        outs += [o for o in engine.step() if o.stream_id == sid]
    return outs


def test_decodes_stop_at_marks_and_the_schedule_restarts(model: Qwen3TokenizerDecoder) -> None:
    engine = make_engine(model, streams=2)
    engine.open("s")
    # Segment 0: 5 frames (chunks 1, 1, 2, then the 1-frame remainder at the mark); segment 1: 3 frames.
    outs = run(
        engine,
        "s",
        [("push", 5), ("tick", 0), ("tick", 0), ("tick", 0), ("mark", 0), ("tick", 0), ("push", 3)]
        + [("mark", 0), ("end", 0)],
    )
    frames = [o.frames for o in outs]
    ends = [o.segment_end for o in outs]
    assert sum(frames) == 8
    # The segment's last output carries the mark; the next segment starts with a 1-frame chunk again.
    cut = ends.index(True)
    assert sum(frames[: cut + 1]) == 5
    assert frames[cut + 1] == 1
    assert ends.count(True) == 2 and outs[-1].final and outs[-1].segment_end


def test_marks_without_new_frames_still_report(model: Qwen3TokenizerDecoder) -> None:
    engine = make_engine(model, streams=2)
    engine.open("s")
    # Two frames decode as whole chunks (1 + 1) before the mark arrives; then an empty segment.
    outs = run(engine, "s", [("push", 2), ("tick", 0), ("tick", 0), ("mark", 0), ("mark", 0), ("end", 0)])
    marks = [o for o in outs if o.segment_end]
    assert len(marks) == 2 and all(o.frames == 0 for o in marks)
    assert sum(o.frames for o in outs) == 2 and outs[-1].final


@pytest.mark.parametrize("sizes", [[3, 7, 1], [25, 26, 4]])
def test_audio_across_segments_equals_the_offline_decode(
    model: Qwen3TokenizerDecoder, sizes: list[int]
) -> None:
    engine = make_engine(model, streams=2)
    engine.open("s")
    all_codes = [codes_for(100 + i, n) for i, n in enumerate(sizes)]
    outs: list[CodecOutput] = []
    for codes in all_codes:
        engine.push("s", codes)
        outs += engine.step()
        engine.end_segment("s")
    engine.finish("s")
    while engine.has_work():
        outs += engine.step()
    pcm = np.concatenate([o.pcm for o in outs])
    ref = offline(model, np.concatenate(all_codes))
    np.testing.assert_allclose(pcm, ref[: pcm.size], atol=TOL, rtol=0)
    assert pcm.size == sum(sizes) * SPF
    # Each segment's samples end exactly at a mark.
    bounds = np.cumsum([0, *[o.pcm.size for o in outs]])
    ends = [int(b) for b, o in zip(bounds[1:], outs, strict=True) if o.segment_end]
    assert ends == [int(x) * SPF for x in np.cumsum(sizes)]


def test_a_mark_after_the_end_is_refused(model: Qwen3TokenizerDecoder) -> None:
    engine = make_engine(model, streams=1)
    engine.open("s")
    engine.finish("s")
    with pytest.raises(ValueError, match="already ended"):
        engine.end_segment("s")
