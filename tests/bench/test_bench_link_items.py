"""``bench/link_items.py``: its items go through the serving link wire unchanged, and it reports each cost."""

from __future__ import annotations

from bench.link_items import KINDS, measure, pcm_item, pcm_item_nested
from voxstage.link import wire


def test_items_round_trip_the_serving_wire_and_every_cost_is_reported() -> None:
    for kind, (make, schema) in KINDS.items():
        builder = wire.BatchBuilder(schema)
        sent = [make(i) for i in range(3)]
        for i, msg in enumerate(sent):
            builder.add(i + 1, msg)
        records, body = builder.take()
        got = [msg for _, _, msg, _ in wire.messages(schema, wire.unpack(records), body)]
        assert got == sent, kind
        costs = measure(kind, items=16, repeats=2)
        assert set(costs) == {"build_us", "encode_us", "decode_us"} and all(v >= 0 for v in costs.values())
    nested, in_place = pcm_item_nested(3), pcm_item(3)
    nested.pcm.sent_unix_ns = in_place.pcm.sent_unix_ns
    assert nested == in_place  # the two ways build the same message
