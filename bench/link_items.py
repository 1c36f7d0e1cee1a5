"""What one hot item costs a stage link's Python, in CPU time per item (issue 27): building the per-request
message, adding it to a batch (``BatchBuilder.add`` + ``take``), and turning a received batch back into
messages (``wire.messages``), for the duplex items of every tick: a user-audio / agent PCM frame (80 ms of
24 kHz f32 inline), a frame of codes (user codes or agent frames), and a credit.

No gRPC and no model: the serving ``voxstage.link.wire`` code on in-memory batches of ``--items`` items,
best of ``--repeats`` rounds. Compare two checkouts by running it in each.

    PYTHONPATH=src:. python -m bench.link_items --out items.json
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from voxstage import wire as payloads
from voxstage.internal.v1 import stage_pb2 as S
from voxstage.link import wire

FRAME_SAMPLES = 1920
GROUPS = 8


def pcm_item(i: int) -> Any:
    msg = S.CodecStreamResponse()
    p = msg.pcm
    p.sample_offset = i * FRAME_SAMPLES
    p.sample_count = FRAME_SAMPLES
    p.format = S.PCM_FORMAT_F32LE
    p.data.inline = payloads.pcm_to_bytes(np.zeros(FRAME_SAMPLES, np.float32), S.PCM_FORMAT_F32LE)
    p.first_frame = i
    p.frame_count = 1
    p.sent_unix_ns = time.time_ns()
    p.user_frame = i
    return msg


def frames_item(i: int) -> Any:
    msg = S.TalkerStreamResponse()
    f = msg.frames
    f.first_frame = i
    f.frame_count = 1
    f.num_groups = GROUPS
    f.codes.inline = payloads.codes_to_bytes(np.zeros((1, GROUPS), np.int64))
    f.text_tokens = np.zeros(1, "<i4").tobytes()
    f.sent_unix_ns = time.time_ns()
    f.user_frame = i
    return msg


def credit_item(i: int) -> Any:
    msg = S.CodecStreamResponse()
    msg.credit.unit = S.CREDIT_UNIT_SAMPLES
    msg.credit.amount = FRAME_SAMPLES
    return msg


def pcm_item_nested(i: int) -> Any:
    """``pcm_item`` as the hot paths built it before: the chunk made first, then given to the response."""
    chunk = S.PcmChunk(
        sample_offset=i * FRAME_SAMPLES,
        sample_count=FRAME_SAMPLES,
        format=S.PCM_FORMAT_F32LE,
        data=S.Payload(
            inline=payloads.pcm_to_bytes(np.zeros(FRAME_SAMPLES, np.float32), S.PCM_FORMAT_F32LE)
        ),
        first_frame=i,
        frame_count=1,
        sent_unix_ns=time.time_ns(),
        user_frame=i,
    )
    return S.CodecStreamResponse(pcm=chunk)


KINDS: dict[str, tuple[Callable[[int], Any], wire.Schema]] = {
    "pcm": (pcm_item, wire.CODEC_RESPONSES),
    "frames": (frames_item, wire.TALKER_RESPONSES),
    "credit": (credit_item, wire.CODEC_RESPONSES),
}


def _best_us(fn: Callable[[], Any], items: int, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.process_time()
        fn()
        best = min(best, time.process_time() - t0)
    return 1e6 * best / items


def measure(kind: str, items: int, repeats: int) -> dict[str, float]:
    make, schema = KINDS[kind]
    built = [make(i) for i in range(items)]
    builder = wire.BatchBuilder(schema)

    def encode() -> tuple[bytes, bytes]:
        for i, msg in enumerate(built):
            builder.add(i + 1, msg)
        return builder.take()

    records, body = encode()

    def decode() -> None:
        for _ in wire.messages(schema, wire.unpack(records), body):
            pass

    return {
        "build_us": _best_us(lambda: [make(i) for i in range(items)], items, repeats),
        "encode_us": _best_us(encode, items, repeats),
        "decode_us": _best_us(decode, items, repeats),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--items", type=int, default=2048, help="items per round (16 ticks of 128 sessions)")
    ap.add_argument("--repeats", type=int, default=7)
    a = ap.parse_args()
    result = {
        "tool": "bench.link_items",
        "items": a.items,
        "repeats": a.repeats,
        "cpu_us_per_item": {kind: measure(kind, a.items, a.repeats) for kind in KINDS},
    }
    # Building a PCM response in place (the serving code's way) against a nested chunk given to it.
    result["cpu_us_per_item"]["pcm"]["build_nested_us"] = _best_us(
        lambda: [pcm_item_nested(i) for i in range(a.items)], a.items, a.repeats
    )
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(result, indent=1))
    print(json.dumps(result["cpu_us_per_item"], indent=1))


if __name__ == "__main__":
    main()
