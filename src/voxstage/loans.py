"""One stream's shared-memory loans, seen from the writer (talker -> codec frames, codec -> gateway PCM).

Wraps the per-stream ``ShmSender``: places payloads (inline or shm, counted in the transport metric), frees
slots on the reader's acks, and makes the stream's handler wait for the last acks after its terminal. That
wait matters: the terminal usually leaves right behind the last data message, and reclaiming a slot the
reader has not copied out yet would turn its next read into a stale reference (DATA_LOSS).
"""

from __future__ import annotations

import asyncio
import contextlib

from voxstage import metrics
from voxstage.internal.v1 import stage_pb2
from voxstage.stage.errors import StageFailure
from voxstage.transport.counters import PATH_INLINE, PATH_SHM
from voxstage.transport.payload import acked_refs, to_payload
from voxstage.transport.shm import ShmError, ShmRef, ShmSender

ACK_GRACE_S = 5.0


class StreamLoans:
    def __init__(self, sender: ShmSender | None, *, counted: bool = True) -> None:
        self.sender = sender
        # On a stage link the payloads ride the tick's slab, which the link lends and counts
        # (voxstage.link.port): counting them here too would count every byte twice.
        self.counted = counted
        self._acked = asyncio.Event()
        self._forfeited = False

    @property
    def lent(self) -> int:
        return self.sender.lent if self.sender is not None else 0

    def payload(self, data: bytes, into: stage_pb2.Payload | None = None) -> stage_pb2.Payload:
        """``data`` inline or in a lent slot, as a Payload (``into``: a message's field, filled in place)."""
        placed: bytes | ShmRef = self.sender.place(data) if self.sender is not None else data
        shm = isinstance(placed, ShmRef)
        if shm:
            self._acked.clear()
        if self.counted:
            metrics.TRANSPORT_BYTES.labels(path=PATH_SHM if shm else PATH_INLINE).inc(len(data))
        return to_payload(placed, into)

    def ack(self, ack: stage_pb2.ShmAck) -> None:
        if self._forfeited:
            return  # an ack that crossed our cancel-time reclaim: the slots are already back
        if self.sender is None:
            raise StageFailure("INVALID_ARGUMENT", "shm_ack: this stream never lent shared memory")
        try:
            self.sender.ack(acked_refs(ack))
        except (ShmError, ValueError) as exc:
            raise StageFailure("INVALID_ARGUMENT", f"shm_ack: {exc}") from exc
        if not self.sender.lent:
            self._acked.set()

    def late_ack(self, ack: stage_pb2.ShmAck) -> None:
        """An ack after the terminal: nothing can be reported in-band any more, so a bad one is dropped."""
        try:
            self.ack(ack)
        except StageFailure:
            return

    async def settle(self, grace: float = ACK_GRACE_S) -> None:
        """Wait until every slot is acked or ``grace`` passed. A reader that went away cancels the handler
        (and this wait) instead; its half-close alone proves nothing, since a downstream may half-close
        before it has read the last chunks."""
        if self.lent:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._acked.wait(), grace)

    def forfeit(self) -> None:
        """The reader sent ``cancel``: it reads none of this stream's regions after that (it copies a chunk
        out while handling the message that carries it), so no ack will come for what is still lent. Take
        it back now rather than hold the stream open for ``settle``'s grace; anything sent later is inline."""
        if self.sender is not None:
            self.sender.close()
            self.sender = None
        self._forfeited = True
        self._acked.set()

    def close(self) -> None:
        """Reclaim whatever is still lent (the reader is done or gone)."""
        if self.sender is not None:
            self.sender.close()
