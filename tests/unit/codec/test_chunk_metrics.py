"""The codec's chunk metrics on the real tiny decoder: how long a chunk's frames waited in the codec, and a
late chunk's cause, as a no-prebuffer player of the stream would hear it (the first chunk starts it; a late
chunk finds it where it stopped). The lateness here is made by sleeping 0.2-0.3 s against 80-160 ms of
audio, so the cause, not the speed of the machine, decides each assertion."""

from __future__ import annotations

import time

import numpy as np
import pytest

from services.codec.engine import CodecEngine
from services.codec.models.qwen3_tts.decoder import Qwen3TokenizerDecoder
from tests.unit.codec.test_engine import codes_for, make_engine, model  # noqa: F401
from voxstage import metrics


def sample(name: str, labels: dict[str, str]) -> float:
    return metrics.REGISTRY.get_sample_value(name, labels) or 0.0


def late(cause: str) -> float:
    return sample("voxstage_codec_late_chunk_seconds_count", {"cause": cause})


def waits(chunk: str) -> float:
    return sample("voxstage_codec_chunk_wait_seconds_count", {"chunk": chunk})


def step_out(engine: CodecEngine) -> int:
    return sum(o.pcm.size for o in engine.step())


@pytest.mark.timeout(60)
def test_late_chunks_are_told_apart_by_cause(model: Qwen3TokenizerDecoder) -> None:  # noqa: F811
    engine = make_engine(model, streams=2)
    codes = codes_for(0, 12)
    before = {c: late(c) for c in ("frames", "codec")}
    first, short = waits("first"), waits("short")
    held = sample("voxstage_codec_chunk_wait_seconds_sum", {"chunk": "short"})
    decoded = sample("voxstage_codec_chunk_decode_seconds_sum", {"chunk": "short"})
    short_decodes = sample("voxstage_codec_chunk_decode_seconds_count", {"chunk": "short"})
    engine.open("s")
    engine.push("s", codes[:1])
    assert step_out(engine) > 0  # the first chunk (1 frame, 80 ms) starts the player
    assert waits("first") == first + 1
    engine.push("s", codes[1:2])
    assert step_out(engine) > 0  # the second at once: on time
    assert {c: late(c) for c in ("frames", "codec")} == before
    time.sleep(0.3)  # the player ran dry 0.16 s after the first chunk: these frames come after that
    engine.push("s", codes[2:4])
    assert step_out(engine) > 0
    assert late("frames") == before["frames"] + 1 and late("codec") == before["codec"]
    engine.push("s", codes[4:8])  # the next chunk's frames, in before the player (0.16 s of audio) runs dry
    time.sleep(0.3)  # ... but the codec holds them past it
    assert step_out(engine) > 0
    assert late("frames") == before["frames"] + 1 and late("codec") == before["codec"] + 1
    assert waits("short") == short + 3
    # The codec held the last chunk 0.3 s: its wait says so, and that it was queued, not decoding.
    waited = sample("voxstage_codec_chunk_wait_seconds_sum", {"chunk": "short"}) - held
    decoding = sample("voxstage_codec_chunk_decode_seconds_sum", {"chunk": "short"}) - decoded
    assert waited >= 0.3
    assert 0.0 < decoding < waited - 0.25
    assert sample("voxstage_codec_chunk_decode_seconds_count", {"chunk": "short"}) == short_decodes + 3


def test_each_chunk_knows_when_its_last_frame_came(model: Qwen3TokenizerDecoder) -> None:  # noqa: F811
    """``StreamState.take``'s ready time is the push that brought a chunk's last frame, however the pushes
    and the chunks are cut."""
    engine = make_engine(model, streams=1)
    engine.open("s")
    stream = engine._streams["s"]
    for i, n in enumerate((3, 1, 5)):  # frames 1-3 at t=10, 4 at t=11, 5-9 at t=12
        stream.add(np.zeros((n, 16), np.int64), 10.0 + i)
    got = [stream.take(n)[1] for n in (1, 2, 1, 4, 1)]
    assert got == [10.0, 10.0, 11.0, 12.0, 12.0]
    assert not stream.arrivals and stream.pending_frames == 0


def decode_parts() -> dict[str, float]:
    parts = {p: sample("voxstage_codec_decode_frames_total", {"part": p}) for p in metrics.DECODE_PARTS}
    return {**parts, "calls": sample("voxstage_codec_decode_calls_total", {})}


def grew(before: dict[str, float]) -> dict[str, float]:
    return {k: v - before[k] for k, v in decode_parts().items()}


def test_decode_rows_are_counted_by_part(model: Qwen3TokenizerDecoder) -> None:  # noqa: F811
    """What the codec's device time bought: every frame row of a call is audio, a reference prefix, or a
    bucket's padding, and the parts add up to the call's batch bucket x frame bucket."""
    engine = make_engine(model, streams=4)
    before = decode_parts()
    for i, key in enumerate("abc"):
        engine.open(key)
        engine.push(key, codes_for(i, 1))
    assert sum(o.frames for o in engine.step()) == 3
    # One call of three 1-frame rows in the 4-row batch bucket: one row of padding.
    assert grew(before) == {"audio": 3, "prefix": 0, "context": 0, "padding": 1, "calls": 1}

    before = decode_parts()
    engine.open("clone", prefix=codes_for(9, 5))  # a voice clone's reference: decoded for its state alone
    engine.push("clone", codes_for(10, 1))
    out = []
    while engine.has_work():
        out += engine.step()
    got = grew(before)
    assert got["prefix"] == 5 and got["audio"] == sum(o.frames for o in out) == 1
    assert got["calls"] == 2 and got["padding"] == 0  # each alone in its call, at its own length
