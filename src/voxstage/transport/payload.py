"""Maps transport values onto ``voxstage.internal.v1`` messages (Payload, ShmRef, ShmAck, TransportHello).

The stream layer sends ``to_payload(sender.place(data))`` and, on receipt, ``read_payload(msg, reader)``;
the second element of the result is the reference to ack (``ack_message``), or None for inline bytes.
"""

from __future__ import annotations

from collections.abc import Iterable

from voxstage.internal.v1 import stage_pb2
from voxstage.transport.host import Hello
from voxstage.transport.shm_layout import InvalidShmReference, ShmRef
from voxstage.transport.shm_reader import ShmReader


def ref_to_proto(ref: ShmRef) -> stage_pb2.ShmRef:
    return stage_pb2.ShmRef(
        region=ref.region, offset=ref.offset, length=ref.length, generation=ref.generation, slot=ref.slot
    )


def ref_from_proto(msg: stage_pb2.ShmRef) -> ShmRef:
    return ShmRef(
        region=msg.region, offset=msg.offset, length=msg.length, generation=msg.generation, slot=msg.slot
    )


def to_payload(placed: bytes | ShmRef, into: stage_pb2.Payload | None = None) -> stage_pb2.Payload:
    """``placed`` as a Payload: ``into`` (a message's own field, filled in place) or a new one."""
    msg = stage_pb2.Payload() if into is None else into
    if isinstance(placed, ShmRef):
        msg.shm.CopyFrom(ref_to_proto(placed))
    else:
        msg.inline = placed
    return msg


def read_payload(msg: stage_pb2.Payload, reader: ShmReader | None) -> tuple[bytes, ShmRef | None]:
    """The payload's bytes, and the reference to ack when it came through shared memory.

    Raises InvalidShmReference for a reference on a stream that never agreed to shared memory (``reader`` is
    None) or an empty Payload, and StaleShmReference when the slot is gone.
    """
    body = msg.WhichOneof("body")
    if body == "inline":
        return msg.inline, None
    if body == "shm":
        if reader is None:
            raise InvalidShmReference(
                f"shared-memory reference to {msg.shm.region!r} on a stream that did not negotiate shm"
            )
        ref = ref_from_proto(msg.shm)
        return reader.read(ref), ref
    raise InvalidShmReference("empty Payload: neither inline bytes nor a shared-memory reference")


def ack_message(refs: Iterable[ShmRef]) -> stage_pb2.ShmAck:
    return stage_pb2.ShmAck(refs=[ref_to_proto(r) for r in refs])


def acked_refs(msg: stage_pb2.ShmAck) -> list[ShmRef]:
    return [ref_from_proto(r) for r in msg.refs]


def hello_to_proto(hello: Hello) -> stage_pb2.TransportHello:
    return stage_pb2.TransportHello(
        boot_id=hello.boot_id,
        hostname=hello.hostname,
        pid=hello.pid,
        probe_region=hello.probe_region,
        shm_threshold_bytes=hello.shm_threshold_bytes,
        verified_peer_probe=hello.verified_peer_probe,
    )


def hello_from_proto(msg: stage_pb2.TransportHello) -> Hello:
    return Hello(
        boot_id=msg.boot_id,
        hostname=msg.hostname,
        pid=msg.pid,
        probe_region=msg.probe_region,
        shm_threshold_bytes=msg.shm_threshold_bytes,
        verified_peer_probe=msg.verified_peer_probe,
    )
