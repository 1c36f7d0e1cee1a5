"""Same-host detection (hello + probe) and the mapping onto voxstage.internal.v1 messages."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from voxstage.internal.v1 import stage_pb2
from voxstage.transport.counters import FALLBACK_PROBE_FAILED, TransportCounters
from voxstage.transport.host import boot_id, local_hello, probe_readable, verify_peer
from voxstage.transport.payload import (
    ack_message,
    acked_refs,
    hello_from_proto,
    hello_to_proto,
    read_payload,
    to_payload,
)
from voxstage.transport.shm import InvalidShmReference, ShmReader, ShmRef, ShmWriter

pytestmark = pytest.mark.skipif(not Path("/dev/shm").is_dir(), reason="needs a Linux /dev/shm")


@pytest.fixture
def counters() -> TransportCounters:
    return TransportCounters()


@pytest.fixture
def writer(counters: TransportCounters) -> Iterator[ShmWriter]:
    w = ShmWriter(threshold_bytes=1024, region_bytes=1 << 20, max_total_bytes=8 << 20, counters=counters)
    yield w
    w.close()


def test_same_host_peer_with_a_readable_probe_is_verified(
    writer: ShmWriter, counters: TransportCounters
) -> None:
    assert boot_id(), "this test needs /proc/sys/kernel/random/boot_id"
    talker = local_hello(probe_region=writer.probe_region, shm_threshold_bytes=writer.threshold_bytes)
    # The codec receives the talker's hello, validates its probe and echoes it back in its own hello.
    echo = verify_peer(hello_from_proto(hello_to_proto(talker)), counters=counters)
    assert echo == writer.probe_region
    codec = hello_from_proto(hello_to_proto(local_hello(verified_peer_probe=echo)))
    assert writer.peer_can_read(codec.verified_peer_probe)
    assert counters.snapshot()["fallbacks"][FALLBACK_PROBE_FAILED] == 0


def test_peer_on_another_host_goes_inline_without_counting_a_fallback(
    writer: ShmWriter, counters: TransportCounters
) -> None:
    peer = local_hello(probe_region=writer.probe_region)
    assert verify_peer(peer, local_boot_id="another-kernel", counters=counters) == ""
    assert counters.snapshot()["fallbacks"][FALLBACK_PROBE_FAILED] == 0


def test_same_kernel_without_shared_dev_shm_falls_back_and_counts(
    writer: ShmWriter, counters: TransportCounters, tmp_path: Path
) -> None:
    # A container that shares the kernel but not /dev/shm sees a different directory: the probe is missing.
    peer = local_hello(probe_region=writer.probe_region)
    assert verify_peer(peer, shm_dir=tmp_path, counters=counters) == ""
    assert counters.snapshot()["fallbacks"][FALLBACK_PROBE_FAILED] == 1


def test_probe_of_a_closed_writer_or_a_non_probe_is_not_readable(counters: TransportCounters) -> None:
    w = ShmWriter(threshold_bytes=1024, region_bytes=1 << 20, max_total_bytes=8 << 20, counters=counters)
    region = w.sender(peer_readable=True).place(os.urandom(5000))
    assert isinstance(region, ShmRef)
    assert probe_readable(w.probe_region)
    assert not probe_readable(region.region)  # a slab region is not a probe
    assert not probe_readable("../voxstage-1-0123456789abcdef-probe")
    w.close()
    assert not probe_readable(w.probe_region)


def test_writer_ignores_an_echo_of_another_writers_probe(
    writer: ShmWriter, counters: TransportCounters
) -> None:
    other = ShmWriter(threshold_bytes=1024, region_bytes=1 << 20, max_total_bytes=8 << 20, counters=counters)
    try:
        # e.g. the peer validated a probe of this stage's previous incarnation, cached from a Status call
        assert not writer.peer_can_read(other.probe_region)
        assert not writer.peer_can_read("")
    finally:
        other.close()


def test_payload_round_trip_inline_and_shm(writer: ShmWriter) -> None:
    sender = writer.sender(peer_readable=True)
    reader = ShmReader()
    try:
        small, big = os.urandom(100), os.urandom(50_000)
        wire = [to_payload(sender.place(p)).SerializeToString() for p in (small, big)]
        msgs = [stage_pb2.Payload.FromString(w) for w in wire]
        assert [m.WhichOneof("body") for m in msgs] == ["inline", "shm"]
        assert read_payload(msgs[0], reader) == (small, None)
        data, ref = read_payload(msgs[1], reader)
        assert data == big and ref is not None
        ack = stage_pb2.ShmAck.FromString(ack_message([ref]).SerializeToString())
        sender.ack(acked_refs(ack))
        assert sender.lent == 0
    finally:
        reader.close()


def test_payload_errors(writer: ShmWriter) -> None:
    msg = to_payload(writer.sender(peer_readable=True).place(os.urandom(5000)))
    with pytest.raises(InvalidShmReference, match="did not negotiate"):
        read_payload(msg, None)
    with pytest.raises(InvalidShmReference, match="empty Payload"):
        read_payload(stage_pb2.Payload(), ShmReader())
