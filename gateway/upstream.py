"""One request's ``Codec.Stream`` as the gateway (the downstream) speaks it; see docs/protocol.md.

The gateway opens the stream with ``open`` (naming the talker it chose and granting an initial window of
PCM samples), forwards text, ``flush`` and ``end_of_input``, re-grants credit as the client takes audio,
and reads until the terminal ``end_of_stream``. It enforces the two connector timeouts of §8: the
first-chunk timeout from the first flush / end of input, and the stall timeout while the codec owes output
and holds enough credit to send it. Errors come back in-band and keep their code; a transport failure or a
stream that ends without a terminal reads as UNAVAILABLE; only a transport UNAVAILABLE marks the codec
replica down (gateway/routing.py says why).

Two tasks own the call, apart from the request's handler: a writer that sends queued messages in order,
and a reader that drains the call eagerly into a local queue (bounded by the credit window, since the codec
never sends beyond it). Keeping gRPC writes out of the handler matters twice over with grpc.aio: a write
interrupted by the handler's cancellation (the client left) cancels the whole call before ``cancel`` could
be sent, and a write that fails because the peer already finished the call turns its status into INTERNAL
and makes every later ``read`` raise, dropping messages still buffered. So the reader records the terminal
the moment it arrives, the writer sends nothing after it, and the call is half-closed right then.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

import grpc

from gateway.errors import GatewayError, code_from_number
from gateway.routing import Replica, ReplicaPool
from voxstage import metrics
from voxstage.internal.v1 import stage_pb2
from voxstage.transport.host import verify_peer
from voxstage.transport.payload import ack_message, hello_from_proto, read_payload
from voxstage.transport.shm_layout import InvalidShmReference, ShmRef, StaleShmReference
from voxstage.transport.shm_reader import ShmReader

log = logging.getLogger(__name__)
STAGE_FULL_RETRY_S = 1.0

CANCEL_GRACE_S = 0.1  # §6: after `cancel`, wait one tick plus this long for the terminal


@dataclass(frozen=True)
class Timeouts:
    first_chunk_s: float
    stall_s: float


@dataclass
class Pcm:
    """A PCM chunk with its payload already read (inline or from shared memory)."""

    data: bytes
    format: int
    sample_count: int
    sample_offset: int
    segment_index: int


Event = Pcm | stage_pb2.SegmentDone | stage_pb2.EndOfStream


class CodecStream:
    def __init__(
        self,
        pool: ReplicaPool,
        replica: Replica,
        *,
        timeouts: Timeouts,
        deadline_s: float | None,
        shm_reader: ShmReader | None = None,
        tick_s: float = 0.08,
    ) -> None:
        self.pool = pool
        self.replica = replica
        self.timeouts = timeouts
        self.tick_s = tick_s
        self._shm = shm_reader
        self._peer_probe = ""
        timeout = None if deadline_s is None else max(deadline_s - time.monotonic(), 0.001)
        # On the replica's link when the codec offers one (docs/protocol.md §12), else a call of its own (a
        # codec older than links). The deadline travels with the request either way.
        link = replica.codec_link(shm_reader)
        self._on_link = link is not None
        self._call: Any = (
            replica.codec_stub.Stream(timeout=timeout)
            if link is None
            else link.stream(timeout, hello_from_proto(replica.status.transport) if replica.status else None)
        )
        self._outbox: asyncio.Queue[stage_pb2.CodecStreamRequest | None] = asyncio.Queue()
        self._writer: asyncio.Task[None] | None = None
        # What the reader got, and the futures receivers sleep on (each woken by a message, by a change of
        # state that moves its timeout, or by its own timeout): a message costs a deque append and at most
        # one future, where a queue get and an event wait under asyncio.wait cost two tasks and their
        # callbacks (twice a session-tick for duplex: the agent frame and the user-audio credit). Usually
        # one receiver; a session's close grace cancels while its runner still waits, so there may be two.
        self._inbox: deque[stage_pb2.CodecStreamResponse | GatewayError] = deque()
        self._reader: asyncio.Task[None] | None = None
        self._waiters: list[asyncio.Future[bool]] = []
        self._terminal_seen = False
        self._failure: BaseException | None = None
        self._pending_acks: list[ShmRef] = []
        self.terminal: stage_pb2.EndOfStream | None = None
        # State for the timeouts: when work was first owed, what is outstanding, and the credit window.
        self._work_since: float | None = None
        self._got_data = False
        self._segments_owed = 0
        self._input_ended = False
        self._credit_left = 0
        self._min_chunk = 0
        self._cancelling = False

    # -- sending ----------------------------------------------------------------------------------------

    async def _write(self, msg: stage_pb2.CodecStreamRequest) -> None:
        if self._writer is None:
            self._writer = asyncio.ensure_future(self._write_loop())  # it half-closes the call at the end
        if self._on_link and self._outbox.empty() and not self._terminal_seen:
            # A request's write on a link never waits, so with nothing queued the writer holds nothing in
            # hand: straight into the link's next batch, in order, without a turn of the loop per message.
            if not self._call.done():
                self._call.write_nowait(msg)
            return
        self._outbox.put_nowait(msg)

    async def _write_loop(self) -> None:
        while (msg := await self._outbox.get()) is not None:
            if self._terminal_seen or self._call.done():
                continue  # see the module docstring: never write into a call that may have ended
            try:
                await self._call.write(msg)
            except (grpc.aio.AioRpcError, asyncio.InvalidStateError) as exc:
                # The reader reports the call's real status; a dead call just stops taking writes.
                log.debug("codec %s: write failed: %s", self.replica.address, exc)
                return
        with contextlib.suppress(grpc.aio.AioRpcError, asyncio.InvalidStateError):
            await self._call.done_writing()

    async def open(self, msg: stage_pb2.StreamOpen, *, min_chunk_samples: int) -> stage_pb2.StreamOpened:
        """Send ``open`` and wait for ``opened``; a refusal raises with the codec's code and message."""
        if self._shm is not None and self.replica.status is not None and not self._on_link:
            # A call of its own may take its chunks through shared memory; on a link they ride the tick's
            # slab, for which the link verified the codec's probe once.
            self._peer_probe = verify_peer(hello_from_proto(self.replica.status.transport))
            msg.transport.verified_peer_probe = self._peer_probe
        self._credit_left = msg.initial_credit.amount
        self._min_chunk = min_chunk_samples
        await self._write(stage_pb2.CodecStreamRequest(open=msg))
        self._reader = asyncio.ensure_future(self._read_loop())
        if self._on_link:
            self._call.take = self._take
        first = await self._receive(time.monotonic() + self.timeouts.first_chunk_s, "opened")
        kind = first.WhichOneof("response")
        if kind == "opened":
            return first.opened
        if kind == "end_of_stream":
            self.terminal = first.end_of_stream
            raise self.error_of(first.end_of_stream)
        raise self._protocol_error(f"expected opened first, got {kind}")

    async def send_text(self, text: str) -> None:
        await self._write(stage_pb2.CodecStreamRequest(text=text))

    async def flush(self) -> None:
        self._owe()
        await self._write(stage_pb2.CodecStreamRequest(flush=stage_pb2.Flush()))

    async def end_of_input(self, *, owes_segment: bool, sent: bool = False) -> None:
        """``sent``: the open carried it (``StreamOpen.initial_end_of_input``): accounting only."""
        if owes_segment:
            self._owe()
        self._input_ended = True
        self._wake()
        if sent:
            return
        # No half-close yet: §2.3 lets credit, shm_ack and cancel follow end_of_input, and a take longer than
        # the window needs them. The call ends with the codec's terminal.
        await self._write(stage_pb2.CodecStreamRequest(end_of_input=stage_pb2.EndOfInput()))

    def _owe(self) -> None:
        self._segments_owed += 1
        if self._work_since is None:
            self._work_since = time.monotonic()
        self._wake()

    async def _send_acks(self) -> None:
        if self._pending_acks:
            refs, self._pending_acks = self._pending_acks, []
            await self._write(stage_pb2.CodecStreamRequest(shm_ack=ack_message(refs)))

    async def grant(self, samples: int) -> None:
        """Return ``samples`` of credit (the chunk was written to the client), acking shm slots first."""
        await self._send_acks()
        self._credit_left += samples
        self._wake()
        credit = stage_pb2.Credit(unit=stage_pb2.CREDIT_UNIT_SAMPLES, amount=samples)
        await self._write(stage_pb2.CodecStreamRequest(credit=credit))

    def fail(self, exc: BaseException) -> None:
        """Make the reader raise ``exc`` (the input side found a client error mid-stream)."""
        self._failure = exc
        self._wake()

    # -- receiving --------------------------------------------------------------------------------------

    def _timeout(self) -> tuple[float | None, str]:
        now = time.monotonic()
        if not self._got_data:
            if self._work_since is None:
                return None, ""  # nothing asked yet: a streaming client may still be typing
            return self._work_since + self.timeouts.first_chunk_s - now, "first-chunk"
        owes = self._segments_owed > 0 or self._input_ended
        if owes and self._credit_left >= self._min_chunk:
            return self.timeouts.stall_s, "stall"
        return None, ""  # waiting for text, or for the client to take audio: not the codec's fault

    async def _read_loop(self) -> None:
        try:
            while True:
                msg = await self._call.read()
                if msg is grpc.aio.EOF:
                    self._deliver(self._ended_without_terminal())
                    return
                assert isinstance(msg, stage_pb2.CodecStreamResponse)
                if msg.HasField("end_of_stream"):
                    self._terminal_seen = True
                    self._outbox.put_nowait(None)  # half-close once what is queued before it is out
                    self._deliver(msg)
                    return
                self._deliver(msg)
        except grpc.aio.AioRpcError as exc:
            self._deliver(self._transport_error(exc))

    def _take(self, msg: stage_pb2.CodecStreamResponse) -> bool:
        """On a link, a message handed to the receiver as it arrives (the link asks only while the reader
        waits on an empty inbox, so the order is the reader's); the terminal is the reader's own."""
        if msg.HasField("end_of_stream"):
            return False
        self._deliver(msg)
        return True

    def _deliver(self, item: stage_pb2.CodecStreamResponse | GatewayError) -> None:
        self._inbox.append(item)
        self._wake()

    def _wake(self) -> None:
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_result(False)

    @staticmethod
    def _expire(waiter: asyncio.Future[bool]) -> None:
        if not waiter.done():
            waiter.set_result(True)

    async def _receive(self, deadline: float | None, what: str) -> stage_pb2.CodecStreamResponse:
        """The next message; ``deadline`` (monotonic) bounds the wait, else the §8 timeouts do."""
        loop = asyncio.get_running_loop()
        while True:
            if self._failure is not None:
                raise self._failure
            if self._inbox:
                got = self._inbox.popleft()
                if isinstance(got, GatewayError):
                    raise got
                return got
            if deadline is not None:
                limit: float | None = deadline - time.monotonic()
            elif self._cancelling:
                limit = None  # cancel() bounds its own wait
            else:
                limit, what = self._timeout()
            waiter: asyncio.Future[bool] = loop.create_future()
            self._waiters.append(waiter)
            timer = None if limit is None else loop.call_later(max(limit, 0.0), self._expire, waiter)
            try:
                timed_out = await waiter
            finally:
                self._waiters.remove(waiter)
                if timer is not None:
                    timer.cancel()
            if timed_out and not self._inbox:
                raise await self._timed_out(what, limit or 0.0)
            # A message, or a change of state (input, credit, failure): look again, with a fresh timeout.

    def _ended_without_terminal(self) -> GatewayError:
        # The call ended with status OK, so the connection worked: a broken stream, not a dead replica.
        self.pool.suspect(self.replica, "stream ended without end_of_stream")
        self._reap()
        return GatewayError(
            grpc.StatusCode.UNAVAILABLE,
            f"codec {self.replica.address}: upstream ended without end_of_stream",
            reason="codec_unavailable",
        )

    async def next_event(self) -> Event:
        msg = await self._receive(None, "")
        kind = msg.WhichOneof("response")
        if kind == "pcm":
            metrics.observe_hop("codec", "gateway", msg.pcm.sent_unix_ns)
            return self._pcm(msg.pcm)
        if kind == "segment_done":
            self._segments_owed = max(self._segments_owed - 1, 0)
            return msg.segment_done
        if kind == "end_of_stream":
            self.terminal = msg.end_of_stream
            return msg.end_of_stream
        if kind == "shm_ack":
            return await self.next_event()  # acks for user audio (duplex only); nothing held here
        raise self._protocol_error(f"unexpected {kind} after opened")

    def _pcm(self, chunk: stage_pb2.PcmChunk) -> Pcm:
        try:
            data, ref = read_payload(chunk.data, self._shm if self._peer_probe else None)
        except InvalidShmReference as exc:
            raise GatewayError(grpc.StatusCode.DATA_LOSS, f"codec {self.replica.address}: {exc}") from None
        except StaleShmReference as exc:
            # The codec took the slot back. While cancelling this is the race of issue 26 (the codec ended
            # the stream and reclaimed its regions while a chunk was on its way): the chunk was to be
            # dropped anyway. Otherwise the codec restarted or reaped its regions: it is unavailable.
            if self._cancelling:
                cancelled = "the request was cancelled"
                raise GatewayError(grpc.StatusCode.CANCELLED, cancelled, reason="cancelled") from None
            why = f"codec {self.replica.address}: audio chunk no longer readable ({exc})"
            raise GatewayError(grpc.StatusCode.UNAVAILABLE, why, reason="codec_unavailable") from None
        if ref is not None:
            self._pending_acks.append(ref)
        self._got_data = True
        self._credit_left -= chunk.sample_count
        return Pcm(data, chunk.format, chunk.sample_count, chunk.sample_offset, chunk.segment_index)

    # -- ending -----------------------------------------------------------------------------------------

    def error_of(self, eos: stage_pb2.EndOfStream) -> GatewayError:
        if eos.reason == stage_pb2.END_REASON_CANCELLED:
            return GatewayError(grpc.StatusCode.CANCELLED, "the request was cancelled", reason="cancelled")
        err = eos.error
        code = code_from_number(err.code)
        origin = err.origin or "codec"
        if code is grpc.StatusCode.UNAVAILABLE and origin == "talker":
            log.warning("talker unavailable behind codec %s: %s", self.replica.address, err.message)
        # A stage with no free slot is worth retrying shortly (the SDK retries RESOURCE_EXHAUSTED only with
        # a hint); anything else it refused is the request's own.
        retry = STAGE_FULL_RETRY_S if code is grpc.StatusCode.RESOURCE_EXHAUSTED else None
        reason = f"{origin}_{code.name.lower()}"
        return GatewayError(code, f"{err.message} (from {origin})", reason=reason, retry_after_s=retry)

    async def cancel(self, reason: str) -> None:
        """§6: send ``cancel``, give the codec one tick plus 100 ms to answer, then cancel the call."""
        self._cancelling = True
        self._failure = None
        if self.terminal is None and not self._call.done():
            await self._write(stage_pb2.CodecStreamRequest(cancel=stage_pb2.Cancel(reason=reason)))
            with contextlib.suppress(GatewayError, TimeoutError):
                async with asyncio.timeout(self.tick_s + CANCEL_GRACE_S):
                    while self.terminal is None:
                        await self.next_event()
                        await self._send_acks()  # frees the shm slots of discarded chunks
        self.close()

    def close(self) -> None:
        for waiter in self._waiters:
            waiter.cancel()  # another receiver (a runner behind a cancel) ends with this stream, not later
        if self._terminal_seen:
            return  # the writer half-closes and the codec ends the call: nothing to tear down
        for task in (self._reader, self._writer):
            if task is not None:
                task.cancel()
        self._call.cancel()

    async def _timed_out(self, what: str, limit: float) -> GatewayError:
        extra = (
            "connector_get_max_wait_first_chunk x connector_get_sleep_s"
            if what.startswith("first")
            else "connector_get_max_wait x connector_get_sleep_s"
        )
        seconds = self.timeouts.first_chunk_s if what.startswith("first") else self.timeouts.stall_s
        err = GatewayError(
            grpc.StatusCode.DEADLINE_EXCEEDED,
            f"codec {self.replica.address}: {what} timeout of {seconds:g} s ({extra}) expired",
            reason=f"{what.replace('-', '_')}_timeout",
        )
        await self.cancel(f"{what} timeout")
        return err

    def _transport_error(self, exc: grpc.aio.AioRpcError) -> GatewayError:
        code = exc.code()
        if code is grpc.StatusCode.DEADLINE_EXCEEDED:
            return GatewayError(code, "the request deadline expired", reason="deadline_exceeded")
        if code is grpc.StatusCode.CANCELLED:
            return GatewayError(code, "the request was cancelled", reason="cancelled")
        if code is grpc.StatusCode.UNAVAILABLE:
            # The transport's own verdict (connect refused, connection reset, GOAWAY): the replica is gone.
            self.pool.mark_down(self.replica, f"{code.name}: {exc.details()}")
        else:
            # INTERNAL, UNKNOWN, RESOURCE_EXHAUSTED, ...: this stream broke (e.g. a write racing the call's
            # end, see the module docstring), not the replica. Taking the only codec out of rotation for it
            # failed the requests behind it; a probe decides instead.
            self.pool.suspect(self.replica, f"{code.name}: {exc.details()}")
        self._reap()
        return GatewayError(
            grpc.StatusCode.UNAVAILABLE,
            f"codec {self.replica.address} failed: {code.name}: {exc.details()}",
            reason="codec_unavailable",
        )

    def _protocol_error(self, what: str) -> GatewayError:
        return GatewayError(grpc.StatusCode.INTERNAL, f"codec {self.replica.address}: protocol error: {what}")

    def _reap(self) -> None:
        # §9: a broken stream may mean a dead writer; unlink its regions once its liveness lock is free.
        if self._shm is not None and self._peer_probe:
            self._shm.reap_peer(self._peer_probe)
