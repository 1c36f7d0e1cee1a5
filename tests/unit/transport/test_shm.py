"""Shared-memory fast path: placement, integrity, release/reuse, staleness, and cleanup after kill -9."""

from __future__ import annotations

import array
import asyncio
import dataclasses
import hashlib
import json
import mmap
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from voxstage.transport.counters import FALLBACK_CAPACITY, FALLBACK_OVERSIZE, TransportCounters
from voxstage.transport.shm import (
    InvalidShmReference,
    ShmReader,
    ShmRef,
    ShmWriter,
    StaleShmReference,
    UnknownShmAck,
    sweep_dead_regions,
)
from voxstage.transport.shm_layout import GEN, GEN_TABLE_OFFSET, HEADER, PAGE, region_data_offset

SHM = Path("/dev/shm")
PEER = Path(__file__).with_name("shm_peer.py")
THRESHOLD = 1024

pytestmark = pytest.mark.skipif(not SHM.is_dir(), reason="needs a Linux /dev/shm")


def _files(prefix: str) -> set[str]:
    return {n for n in os.listdir(SHM) if n.startswith(prefix) or n.startswith("." + prefix)}


@pytest.fixture
def counters() -> TransportCounters:
    return TransportCounters()


@pytest.fixture
def writer(counters: TransportCounters) -> Iterator[ShmWriter]:
    w = ShmWriter(threshold_bytes=THRESHOLD, region_bytes=1 << 20, max_total_bytes=8 << 20, counters=counters)
    yield w
    w.close()
    assert not _files(w.prefix), "close() must unlink every region"


@pytest.fixture
def reader() -> Iterator[ShmReader]:
    r = ShmReader()
    yield r
    r.close()


def _ref(placed: bytes | ShmRef) -> ShmRef:
    assert isinstance(placed, ShmRef), f"expected a shared-memory reference, got {type(placed).__name__}"
    return placed


def test_threshold_splits_inline_and_shm(writer: ShmWriter, counters: TransportCounters) -> None:
    sender = writer.sender(peer_readable=True)
    small = sender.place(b"a" * THRESHOLD)  # "exceeds the threshold" is strict
    big = sender.place(b"b" * (THRESHOLD + 1))
    assert small == b"a" * THRESHOLD
    assert isinstance(big, ShmRef) and big.length == THRESHOLD + 1
    snap = counters.snapshot()
    assert snap["bytes_by_path"] == {"shm": THRESHOLD + 1, "inline": THRESHOLD}
    assert snap["payloads_by_path"] == {"shm": 1, "inline": 1}
    assert sum(snap["fallbacks"].values()) == 0


def test_peer_that_cannot_read_gets_everything_inline(writer: ShmWriter, counters: TransportCounters) -> None:
    sender = writer.sender(peer_readable=False)
    assert sender.place(b"x" * 100_000) == b"x" * 100_000
    assert counters.snapshot()["bytes_by_path"] == {"shm": 0, "inline": 100_000}
    assert writer.stats().slots_lent == 0


@pytest.mark.parametrize("size", [THRESHOLD + 1, 4096, 4097, 70_000, 1 << 20])
def test_round_trip_integrity(writer: ShmWriter, reader: ShmReader, size: int) -> None:
    payload = os.urandom(size)
    ref = _ref(writer.sender(peer_readable=True).place(payload))
    assert reader.read(ref) == payload


def test_non_byte_buffers_are_sent_as_raw_bytes(writer: ShmWriter, reader: ShmReader) -> None:
    codes = array.array("h", range(-1000, 1000))  # int16 codes, as a [frames, groups] block would be
    ref = _ref(writer.sender(peer_readable=True).place(memoryview(codes)))
    assert reader.read(ref) == codes.tobytes()


def test_ack_releases_the_slot_and_it_is_reused(writer: ShmWriter, reader: ShmReader) -> None:
    sender = writer.sender(peer_readable=True)
    first = _ref(sender.place(b"1" * 5000))
    assert reader.read(first) == b"1" * 5000
    assert sender.lent == 1 and writer.stats().slots_lent == 1
    sender.ack([first])
    assert sender.lent == 0 and writer.stats().slots_lent == 0
    second = _ref(sender.place(b"2" * 5000))
    assert (second.region, second.slot, second.offset) == (first.region, first.slot, first.offset)
    assert second.generation == first.generation + 2  # released (even), then lent again (odd)
    assert reader.read(second) == b"2" * 5000
    with pytest.raises(StaleShmReference, match="generation"):
        reader.read(first)


def test_acked_reference_is_stale_even_before_reuse(writer: ShmWriter, reader: ShmReader) -> None:
    sender = writer.sender(peer_readable=True)
    ref = _ref(sender.place(b"z" * 5000))
    sender.ack([ref])
    with pytest.raises(StaleShmReference):
        reader.read(ref)


def test_bad_acks_are_rejected(writer: ShmWriter) -> None:
    a, b = writer.sender(peer_readable=True), writer.sender(peer_readable=True)
    ref = _ref(a.place(b"q" * 5000))
    with pytest.raises(UnknownShmAck, match="not lent on this stream"):
        b.ack([ref])  # another stream's loan
    a.ack([ref])
    with pytest.raises(UnknownShmAck):
        a.ack([ref])  # twice
    with pytest.raises(UnknownShmAck, match="not owned"):
        a.ack([ShmRef("voxstage-1-0123456789abcdef-r0", 4096, 10, 1, 0)])


def test_unlinked_region_is_stale(writer: ShmWriter, reader: ShmReader) -> None:
    sender = writer.sender(peer_readable=True)
    attached = _ref(sender.place(b"m" * 5000))
    assert reader.read(attached) == b"m" * 5000  # the reader now holds a mapping of the region
    os.unlink(SHM / attached.region)
    with pytest.raises(StaleShmReference, match="unlinked"):
        reader.read(attached)
    with pytest.raises(StaleShmReference, match="no longer exists"):
        ShmReader().read(attached)  # a reader that never mapped it


def test_bumped_generation_is_stale(writer: ShmWriter, reader: ShmReader) -> None:
    ref = _ref(writer.sender(peer_readable=True).place(b"g" * 5000))
    fd = os.open(SHM / ref.region, os.O_RDWR)
    try:
        with mmap.mmap(fd, 0) as buf:
            GEN.pack_into(buf, GEN_TABLE_OFFSET + GEN.size * ref.slot, ref.generation + 2)
    finally:
        os.close(fd)
    with pytest.raises(StaleShmReference, match="generation"):
        reader.read(ref)


def test_bad_magic_is_stale(writer: ShmWriter, reader: ShmReader) -> None:
    sender = writer.sender(peer_readable=True)
    ref = _ref(sender.place(b"h" * 5000))
    assert reader.read(ref) == b"h" * 5000
    fd = os.open(SHM / ref.region, os.O_RDWR)
    try:
        with mmap.mmap(fd, 0) as buf:
            buf[0:8] = b"NOTVOXSH"
    finally:
        os.close(fd)
    with pytest.raises(StaleShmReference, match="magic"):
        reader.read(ref)  # cached mapping
    with pytest.raises(StaleShmReference, match="magic"):
        ShmReader().read(ref)  # fresh attach


def test_malformed_references_are_rejected(writer: ShmWriter, reader: ShmReader) -> None:
    ref = _ref(writer.sender(peer_readable=True).place(b"k" * 5000))
    for bad in [
        ShmRef("../../etc/passwd", ref.offset, 10, ref.generation, ref.slot),
        ShmRef(writer.probe_region, ref.offset, 10, ref.generation, ref.slot),
        ShmRef(ref.region, ref.offset, ref.length, ref.generation, 10_000),
        ShmRef(ref.region, ref.offset + 1, ref.length, ref.generation, ref.slot),
        ShmRef(ref.region, ref.offset, 1 << 30, ref.generation, ref.slot),
    ]:
        with pytest.raises(InvalidShmReference):
            reader.read(bad)
    assert reader.read(ref) == b"k" * 5000


def test_close_invalidates_outstanding_references(counters: TransportCounters, reader: ShmReader) -> None:
    w = ShmWriter(threshold_bytes=THRESHOLD, region_bytes=1 << 20, max_total_bytes=8 << 20, counters=counters)
    ref = _ref(w.sender(peer_readable=True).place(b"c" * 5000))
    assert reader.read(ref) == b"c" * 5000
    assert len(_files(w.prefix)) == 2  # probe + one region
    w.close()
    assert not _files(w.prefix)
    with pytest.raises(StaleShmReference):
        reader.read(ref)
    assert reader.prune() == 0  # read() already dropped the dead mapping


def test_regions_grow_up_to_the_cap_then_fall_back(counters: TransportCounters) -> None:
    # 60 kB payloads use 64 KiB slots, 4 per 256 KiB region. The cap holds the probe page, two full regions
    # and one more slot's bytes, but not that slot's header: a third region (even of one slot) cannot fit.
    slot = 64 << 10
    cap = PAGE + 2 * (region_data_offset(4) + 4 * slot) + slot
    w = ShmWriter(threshold_bytes=THRESHOLD, region_bytes=4 * slot, max_total_bytes=cap, counters=counters)
    try:
        sender = w.sender(peer_readable=True)
        placed = [sender.place(os.urandom(60_000)) for _ in range(9)]
        refs = [p for p in placed if isinstance(p, ShmRef)]
        assert len(refs) == 8 and isinstance(placed[-1], bytes)
        assert len({r.region for r in refs}) == 2 and w.stats().regions == 2
        assert counters.snapshot()["fallbacks"][FALLBACK_CAPACITY] == 1
        sender.ack(refs[:1])
        assert isinstance(sender.place(os.urandom(60_000)), ShmRef)  # room again after an ack
        assert isinstance(sender.place(os.urandom(700_000)), bytes)  # never fits under the cap
        assert counters.snapshot()["fallbacks"][FALLBACK_OVERSIZE] == 1
    finally:
        w.close()


def test_sender_close_reclaims_only_its_own_loans(writer: ShmWriter) -> None:
    a, b = writer.sender(peer_readable=True), writer.sender(peer_readable=True)
    for _ in range(3):
        a.place(os.urandom(5000))
    b_ref = _ref(b.place(os.urandom(5000)))
    assert a.close() == 3
    assert writer.stats().slots_lent == 1
    b.ack([b_ref])
    assert writer.stats().slots_lent == 0


def test_forked_child_exit_leaves_the_parents_regions_alone(writer: ShmWriter, reader: ShmReader) -> None:
    ref = _ref(writer.sender(peer_readable=True).place(b"f" * 5000))
    pid = os.fork()
    if pid == 0:  # the child inherits the writer; its interpreter exit runs the same finalizer
        try:
            writer._finalizer()
        finally:
            os._exit(0)
    assert os.waitpid(pid, 0)[1] == 0
    assert len(_files(writer.prefix)) == 2
    assert reader.read(ref) == b"f" * 5000  # generations untouched by the child


def test_writer_rejects_bad_settings() -> None:
    with pytest.raises(ValueError, match="threshold_bytes"):
        ShmWriter(threshold_bytes=-1)
    with pytest.raises(ValueError, match="max_total_bytes"):
        ShmWriter(threshold_bytes=0, region_bytes=1 << 20, max_total_bytes=1 << 20)


def test_header_fits_before_the_generation_table() -> None:
    assert HEADER.size <= GEN_TABLE_OFFSET


# ---- real processes, kill -9 ----


def _spawn(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(PEER), *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def _first_line(proc: subprocess.Popen[str]) -> dict[str, Any]:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line, f"peer exited early with {proc.wait(timeout=10)}"
    info: dict[str, Any] = json.loads(line)
    return info


def _kill9(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGKILL)
    assert proc.wait(timeout=10) == -signal.SIGKILL


def test_writer_killed_reader_reaps_its_regions(reader: ShmReader) -> None:
    proc = _spawn("writer", "5000", "3")
    try:
        info = _first_line(proc)
        probe, prefix = str(info["probe"]), str(info["prefix"])
        refs = [ShmRef(**r) for r in info["refs"]]
        assert [hashlib.sha256(reader.read(r)).hexdigest() for r in refs] == info["sha256"]
        assert len(_files(prefix)) >= 2
        assert reader.reap_peer(probe) == [] and len(_files(prefix)) >= 2  # a live writer is left alone
    finally:
        _kill9(proc)
    assert _files(prefix), "kill -9 leaves the files behind until the survivor notices"
    removed = reader.reap_peer(probe)
    assert set(removed) >= {probe, *(r.region for r in refs)}
    assert not _files(prefix), f"left in /dev/shm: {_files(prefix)}"
    with pytest.raises(StaleShmReference):
        reader.read(refs[0])


def test_reader_killed_writer_reclaims_its_slots(writer: ShmWriter) -> None:
    sender = writer.sender(peer_readable=True)
    payloads = [os.urandom(5000) for _ in range(3)]
    refs = [_ref(sender.place(p)) for p in payloads]
    proc = _spawn("reader")
    assert proc.stdin is not None and proc.stdout is not None
    try:
        for ref, payload in zip(refs, payloads, strict=True):
            proc.stdin.write(json.dumps(dataclasses.asdict(ref)) + "\n")
            proc.stdin.flush()
            assert json.loads(proc.stdout.readline()) == {"sha256": hashlib.sha256(payload).hexdigest()}
        sender.ack(refs[:1])  # the peer acked the first one before dying
    finally:
        _kill9(proc)
    assert proc.stdout.read() == ""  # what the stream layer sees: the peer's side is closed
    assert sender.lent == 2
    assert sender.close() == 2
    assert writer.stats().slots_lent == 0
    again = writer.sender(peer_readable=True)
    reused = {(r.region, r.slot) for r in (_ref(again.place(os.urandom(5000))) for _ in range(3))}
    assert reused == {(r.region, r.slot) for r in refs}


def test_startup_sweep_removes_dead_owners_only() -> None:
    dead, live = _spawn("writer", "5000", "1"), _spawn("writer", "5000", "1")
    try:
        dead_prefix = str(_first_line(dead)["prefix"])
        live_prefix = str(_first_line(live)["prefix"])
        _kill9(dead)
        dead_files, live_files = _files(dead_prefix), _files(live_prefix)
        assert dead_files and live_files
        removed = set(sweep_dead_regions())
        assert removed >= dead_files
        assert not removed & live_files
        assert not _files(dead_prefix) and _files(live_prefix) == live_files
    finally:
        if live.poll() is None:
            assert live.stdin is not None
            live.stdin.close()  # EOF: exits normally without calling close(); the finalizer must clean up
            assert live.wait(timeout=10) == 0
        if dead.poll() is None:
            _kill9(dead)
    assert not _files(live_prefix), "a normal exit must unlink the writer's regions"


def test_explicit_close_in_another_process_cleans_up() -> None:
    proc = _spawn("writer", "5000", "2")
    info = _first_line(proc)
    assert proc.stdin is not None
    proc.stdin.write("close\n")
    proc.stdin.flush()
    assert proc.wait(timeout=10) == 0
    assert not _files(str(info["prefix"]))


def test_sweep_spares_a_probe_being_created(tmp_path: Path) -> None:
    temp = tmp_path / ".voxstage-999999-0123456789abcdef-probe.tmp"
    temp.write_bytes(b"")
    assert sweep_dead_regions(tmp_path) == [] and temp.exists()  # young: its writer may be mid-creation
    assert sweep_dead_regions(tmp_path, temp_grace_s=0.0) == [temp.name] and not temp.exists()


async def test_a_cancel_forfeits_the_loans_of_its_stream(writer: ShmWriter) -> None:
    from voxstage.internal.v1 import stage_pb2
    from voxstage.loans import StreamLoans

    loans = StreamLoans(writer.sender(peer_readable=True))
    assert loans.payload(b"x" * (THRESHOLD + 1)).WhichOneof("body") == "shm" and loans.lent == 1
    loans.forfeit()  # the reader cancelled: it will never ack
    assert loans.lent == 0
    await asyncio.wait_for(loans.settle(grace=30.0), 1.0)  # nothing left to wait for
    assert loans.payload(b"y" * (THRESHOLD + 1)).WhichOneof("body") == "inline"
    loans.ack(stage_pb2.ShmAck())  # an ack that crossed the cancel is ignored, not an error
    loans.close()
