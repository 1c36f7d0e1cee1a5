"""The packed form of a stage-link batch (voxstage.link.wire, docs/protocol.md §12) and its one slab in
shared memory (voxstage.link.port): every per-request message comes back as it was sent, in order; a body
above the threshold travels as one shared-memory slot that the reader's ack frees."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from voxstage.internal.v1 import stage_pb2 as S
from voxstage.link import port, wire
from voxstage.link.port import Port
from voxstage.transport.shm import ShmWriter
from voxstage.transport.shm_reader import ShmReader


def _frames(i: int) -> S.TalkerStreamResponse:
    f = S.CodecFrames(
        first_frame=i,
        frame_count=1,
        num_groups=8,
        text_tokens=np.array([7 + i], "<i4").tobytes(),
        transcript_delta=f"wörd{i} ",
        sent_unix_ns=123 + i,
        user_frame=i - 1,
        segment_index=2,
    )
    f.codes.inline = np.arange(8, dtype="<i2").tobytes()
    return S.TalkerStreamResponse(frames=f)


def _pcm(i: int, n: int = 1920) -> S.CodecStreamResponse:
    p = S.PcmChunk(
        sample_offset=i * n,
        sample_count=n,
        format=S.PCM_FORMAT_F32LE,
        first_frame=i,
        frame_count=1,
        transcript_delta="" if i % 2 else "hi ",
        sent_unix_ns=9,
        user_frame=-1 if i == 0 else i,
    )
    p.data.inline = np.full(n, i, "<f4").tobytes()
    return S.CodecStreamResponse(pcm=p)


def test_every_kind_comes_back_as_sent_in_order() -> None:
    b = wire.BatchBuilder(wire.TALKER_RESPONSES)
    sent = [
        (1, S.TalkerStreamResponse(opened=S.StreamOpened(request_id="a", num_code_groups=8))),
        (2, _frames(0)),
        (1, _frames(5)),
        (2, S.TalkerStreamResponse(credit=S.Credit(unit=S.CREDIT_UNIT_FRAMES, amount=3))),
        (1, S.TalkerStreamResponse(end_of_stream=S.EndOfStream(reason=S.END_REASON_EOS, frame_count=6))),
    ]
    for request, msg in sent:
        b.add(request, msg)
    b.signal(1, wire.END, code=0)
    b.signal(2, wire.END, code=13, details="boom")
    items, body = b.take()
    assert len(items) == 7 * wire.ITEM.itemsize and len(b) == 0
    got = list(wire.messages(wire.TALKER_RESPONSES, wire.unpack(items), body))
    assert [(r, m) for r, _, m, _ in got[:5]] == sent
    kinds = [wire.MESSAGE, wire.FRAMES, wire.FRAMES, wire.CREDIT, wire.MESSAGE]
    assert [k for _, k, _, _ in got[:5]] == kinds
    assert [(r, m) for r, k, m, _ in got[5:]] == [(1, (0, "")), (2, (13, "boom"))]


def test_pcm_requests_and_signals_with_a_deadline() -> None:
    b = wire.BatchBuilder(wire.CODEC_REQUESTS)
    audio = S.CodecStreamRequest(user_audio=_pcm(3).pcm)
    b.add(4, S.CodecStreamRequest(open=S.StreamOpen(request_id="x")), timeout_ms=2500)
    b.add(4, audio)
    b.signal(4, wire.HALF_CLOSE)
    b.signal(5, wire.RESET)
    items, body = b.take()
    got = list(wire.messages(wire.CODEC_REQUESTS, wire.unpack(items), body))
    assert got[0][3] == 2500 and got[1][2] == audio and got[1][1] == wire.PCM
    assert [(r, k, m) for r, k, m, _ in got[2:]] == [(4, wire.HALF_CLOSE, None), (5, wire.RESET, None)]
    with pytest.raises(ValueError, match="whole"):
        wire.unpack(items[:-1])
    with pytest.raises(ValueError, match="outside"):
        list(wire.messages(wire.CODEC_REQUESTS, wire.unpack(items), body[:10]))
    with pytest.raises(ValueError, match="carries none"):  # codec requests have no frames arm
        fb = wire.BatchBuilder(wire.TALKER_RESPONSES)
        fb.add(1, _frames(0))
        list(wire.messages(wire.CODEC_REQUESTS, *(lambda t: (wire.unpack(t[0]), t[1]))(fb.take())))


def test_a_payload_already_in_shared_memory_travels_as_its_message() -> None:
    b = wire.BatchBuilder(wire.CODEC_RESPONSES)
    msg = _pcm(0)
    msg.pcm.data.shm.region, msg.pcm.data.shm.length = "voxstage-1-x-r0", 10
    b.add(1, msg)
    items, body = b.take()
    ((_, kind, back, _),) = wire.messages(wire.CODEC_RESPONSES, wire.unpack(items), body)
    assert kind == wire.MESSAGE and back == msg


async def test_a_large_tick_goes_as_one_shared_memory_slab_freed_by_the_ack(tmp_path: Path) -> None:
    writer = ShmWriter(threshold_bytes=64 * 1024, shm_dir=tmp_path)
    reader = ShmReader(shm_dir=tmp_path)
    try:
        up, down = Port(wire.CODEC_RESPONSES, "upstream"), Port(wire.CODEC_REQUESTS, "downstream")
        up.sender = writer.sender(peer_readable=True)
        for i in range(64):  # 64 sessions' frame of f32 PCM: 480 KiB
            up.add(i + 1, _pcm(i))
        await asyncio.wait_for(up.wake.wait(), 1)
        envelope = up.cut()
        assert isinstance(envelope, S.CodecLinkResponse)
        batch = envelope.batch
        assert batch.body.WhichOneof("body") == "shm"
        assert up.sender.lent == 1
        body = down.receive(batch, reader)
        got = list(wire.messages(wire.CODEC_RESPONSES, wire.unpack(batch.items), body))
        assert [m for _, _, m, _ in got] == [_pcm(i) for i in range(64)]
        ack = down.cut()  # the reader's next batch acks the slot
        assert isinstance(ack, S.CodecLinkRequest) and len(ack.batch.shm_ack.refs) == 1
        up.receive(ack.batch, None)
        assert up.sender.lent == 0
        small = Port(wire.CODEC_RESPONSES, "upstream")
        small.sender = writer.sender(peer_readable=True)
        small.add(1, _pcm(0))
        assert small.cut().batch.body.WhichOneof("body") == "inline"
    finally:
        reader.close()
        writer.close()


def test_a_backlog_goes_out_in_batches_of_bounded_size_in_order() -> None:
    b = wire.BatchBuilder(wire.CODEC_RESPONSES, max_body_bytes=20_000)
    sent = [(i % 5 + 1, _pcm(i)) for i in range(12)]  # 7.7 KB each: three per batch
    for request, msg in sent:
        b.add(request, msg)
    b.signal(1, wire.END)
    got, sizes = [], []
    while len(b):
        items, body = b.take()
        sizes.append(len(body))
        got += [(r, m) for r, k, m, _ in wire.messages(wire.CODEC_RESPONSES, wire.unpack(items), body)]
    assert got == [*sent, (1, (0, ""))]
    assert len(sizes) == 5 and max(sizes) < 20_000 + 7_700  # the END signal starts the fifth


def _user_audio(i: int) -> S.CodecStreamRequest:
    return S.CodecStreamRequest(user_audio=_pcm(i).pcm)


async def _batch(p: Port, within: float) -> tuple[float, list[int]]:
    await asyncio.wait_for(p.wake.wait(), within)
    p.wake.clear()
    at, envelope = asyncio.get_running_loop().time(), p.cut()
    return at, [int(r) for r in wire.unpack(envelope.batch.items)["request"]]


async def test_user_audio_lingers_on_the_gateways_end_and_nothing_else_does(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """User frames arriving one by one leave at most one batch per USER_AUDIO_LINGER_S, each at most that
    late; any other item, and every item of the upstream end, goes with the loop's next turn. (Windows far
    apart from the waits, so that a loaded machine's scheduling cannot pass for either.)"""
    monkeypatch.setattr(port, "USER_AUDIO_LINGER_S", 60.0)
    down = Port(wire.CODEC_REQUESTS, "downstream")
    down.add(1, _user_audio(0))  # the link was idle: at once
    last, first = await _batch(down, 5)
    assert first == [1]
    monkeypatch.setattr(port, "USER_AUDIO_LINGER_S", 0.3)
    down.add(2, _user_audio(1))  # right after a batch: it waits for the window's end...
    await asyncio.sleep(0.05)
    down.add(3, _user_audio(2))  # ...and takes the frames that come meanwhile
    assert not down.wake.is_set()
    at, second = await _batch(down, 10)
    assert second == [2, 3] and at - last >= 0.3

    monkeypatch.setattr(port, "USER_AUDIO_LINGER_S", 60.0)
    down.add(4, _user_audio(3))  # lingering...
    await asyncio.sleep(0.05)
    assert not down.wake.is_set()
    down.add(5, S.CodecStreamRequest(credit=S.Credit(unit=S.CREDIT_UNIT_SAMPLES, amount=1920)))
    _, third = await _batch(down, 5)  # ...until a credit goes: it takes the frame along, at once
    assert third == [4, 5]
    assert down._due is None  # the window's own cut was cancelled with it

    up = Port(wire.CODEC_RESPONSES, "upstream")  # the codec's end never lingers
    for i in range(2):
        up.add(1, _pcm(i))
        assert (await _batch(up, 5))[1] == [1]


def test_the_protocol_states_the_linger_the_port_uses() -> None:
    text = (Path(__file__).resolve().parents[2] / "docs" / "protocol.md").read_text()
    ms = f"{port.USER_AUDIO_LINGER_S * 1000:g} ms"
    assert f"at least {ms} ago (`voxstage.link.port.USER_AUDIO_LINGER_S`)" in " ".join(text.split())
    assert f"one per {ms} per link" in " ".join(text.split())
