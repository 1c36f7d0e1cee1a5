"""The codec's side of one Talker.Stream: open, frame credit, shm read/ack, timeouts and peer death.

Owned by one ``CodecStream``. The reader task turns the talker's messages into calls on the stream
(``frames_in``, ``talker_ended``, ``fail``); the writer task is the only coroutine that writes to the call
(grpc.aio allows one writer at a time). A stream that ends without ``end_of_stream`` is the talker dying:
the request fails with UNAVAILABLE at once, the channel is dropped so the next request dials afresh, and the
dead talker's shared-memory files are reaped before the failure is reported.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import TYPE_CHECKING, Any

import grpc
import numpy as np

from voxstage import metrics, wire
from voxstage.internal.v1 import stage_pb2 as S
from voxstage.stage.errors import StageFailure
from voxstage.transport.host import local_hello, verify_peer
from voxstage.transport.payload import ack_message, hello_from_proto, hello_to_proto, read_payload
from voxstage.transport.shm_layout import InvalidShmReference, ShmError, StaleShmReference

if TYPE_CHECKING:
    from services.codec.stream import CodecStream
    from services.codec.upstream import TalkerPool

log = logging.getLogger(__name__)
CANCEL_GRACE_S = 2.0  # how long a cancelled talker call may take to answer before it is torn down
_background: set[asyncio.Task[None]] = set()


class TalkerRefused(Exception):
    """The talker answered ``open`` with ``end_of_stream`` (its error is relayed unchanged)."""

    def __init__(self, error: S.StreamError) -> None:
        super().__init__(error.message)
        self.error = error


class TalkerRelay:
    def __init__(self, stream: CodecStream, pool: TalkerPool, address: str, timeout: float | None) -> None:
        self.stream = stream
        self.pool = pool
        self.address = address
        self.peer = pool.peer(address)
        self.timeout = timeout
        self.queue: asyncio.Queue[S.TalkerStreamRequest | None] = asyncio.Queue()
        self.call: Any = None  # a grpc.aio.StreamStreamCall, or a LinkCall
        self.direct = False  # the call is a LinkCall: ``_send`` may write to it without the writer task
        self.tasks: list[asyncio.Task[None]] = []
        self.opened: asyncio.Future[S.StreamOpened] = asyncio.get_running_loop().create_future()
        self.outstanding = 0  # frames granted to the talker and not yet received
        self.received = 0
        self.done = False  # the talker's terminal arrived, the call broke, or we cancelled
        self.half_closed = False
        self.eoi_sent = False
        self.shm_ok = False
        self.probe = ""
        self.segment_done: S.SegmentDone | None = None
        self.queued_s: float | None = None
        extra = stream.srv.stream_config
        self.first_timeout = extra.first_chunk_timeout_s
        self.stall_timeout = extra.stall_timeout_s
        self._first: asyncio.TimerHandle | None = None
        self._stall: asyncio.TimerHandle | None = None
        self._stall_from = 0.0  # loop time the stall clock last restarted (``_rearm_stall``)

    async def open(self, msg: S.StreamOpen) -> S.StreamOpened:
        self.peer = self.pool.current(self.peer)
        hello = await self.pool.hello(self.peer)
        self.probe = hello.probe_region
        writer = self.stream.srv.shm_writer
        self.outstanding = msg.initial_credit.amount
        # The hello may have waited: if another stream to this talker broke meanwhile, its channel is closed.
        # UNAVAILABLE (not the closed channel's usage error) lets the gateway retry on another talker.
        if self.pool.current(self.peer) is not self.peer:
            raise StageFailure("UNAVAILABLE", f"talker {self.address}: its channel broke while opening")
        # On the talker's link when it offers one (docs/protocol.md §12); the deadline travels with the
        # request, and its payloads ride the link's slab, whose shared memory the link negotiated once.
        link = self.pool.link(self.peer, writer)
        if link is None:
            # A call of its own (a talker older than links): this request's frames may come through shared
            # memory, so it offers its own hello and verdict on the talker's probe (§9).
            verified = verify_peer(hello)
            self.shm_ok = bool(verified)
            msg.transport.CopyFrom(
                hello_to_proto(
                    local_hello(
                        probe_region=writer.probe_region if writer else "",
                        shm_threshold_bytes=writer.threshold_bytes if writer else 0,
                        verified_peer_probe=verified,
                    )
                )
            )
        self.call = (
            self.peer.stub.Stream(timeout=self.timeout) if link is None else link.stream(self.timeout, hello)
        )
        self.direct = link is not None
        self._send(S.TalkerStreamRequest(open=msg))
        self.tasks = [asyncio.ensure_future(self._write()), asyncio.ensure_future(self._read())]
        return await self.opened

    # -- codec -> talker -------------------------------------------------------------------------------
    def forward_input(self, msg: S.CodecStreamRequest) -> None:
        if self.done:
            return  # the talker already ended (frame budget, EOS): later text has nothing to feed
        kind = msg.WhichOneof("request")
        if kind == "text":
            self._send(S.TalkerStreamRequest(text=msg.text))
            return
        if kind == "flush":
            self._send(S.TalkerStreamRequest(flush=S.Flush()))
        else:
            self._send(S.TalkerStreamRequest(end_of_input=S.EndOfInput()))
            self.eoi_sent = True
        self.input_given()

    def input_given(self, *, ended: bool = False) -> None:
        """The talker has something to work on from here (docs/protocol.md §8): the first-frame timeout
        runs. ``ended``: the end of input went too (inside the talker's open)."""
        self.eoi_sent = self.eoi_sent or ended
        if self._first is None and not self.received:
            self._first = asyncio.get_running_loop().call_later(self.first_timeout, self._expired, "first")
        self._rearm_stall()

    def grant(self, frames: int) -> None:
        if self.done or frames <= 0:
            return
        self.outstanding += frames
        self._send(S.TalkerStreamRequest(credit=S.Credit(unit=S.CREDIT_UNIT_FRAMES, amount=frames)))
        self._rearm_stall()

    def cancel(self, reason: str) -> None:
        if self.done or self.call is None:
            self.done = True
            return
        self.done = True
        self._stop_timers()
        self._send(S.TalkerStreamRequest(cancel=S.Cancel(reason=reason)))
        self._half_close()

    def _send(self, msg: S.TalkerStreamRequest) -> None:
        """To the talker, in order: on a link, straight into its next batch when nothing waits in the queue
        before it (a link request's write never waits, so the writer task holds nothing in hand), else
        through the writer task, the only coroutine that writes to a call of its own."""
        if self.direct and not self.half_closed and self.queue.empty():
            with contextlib.suppress(asyncio.InvalidStateError):  # the request ended: the reader reports it
                self.call.write_nowait(msg)
            return
        self.queue.put_nowait(msg)

    def _half_close(self) -> None:
        if not self.half_closed:
            self.half_closed = True
            self.queue.put_nowait(None)

    async def _write(self) -> None:
        assert self.call is not None
        try:
            while (msg := await self.queue.get()) is not None:
                await self.call.write(msg)
            await self.call.done_writing()
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001 - a dead call: the reader sees it and reports it
            return

    # -- talker -> codec -------------------------------------------------------------------------------
    async def _read(self) -> None:
        assert self.call is not None
        try:
            async for resp in self.call:
                kind = resp.WhichOneof("response")
                if kind == "opened":
                    self._on_opened(resp.opened)
                elif kind == "frames":
                    self._frames(resp.frames)
                elif kind == "segment_done":
                    self.segment_done = resp.segment_done
                    await self._segment_done(resp.segment_done)
                elif kind == "end_of_stream":
                    await self._on_terminal(resp.end_of_stream)
                    return
                else:
                    self._on_other(resp)
            reason = "the call ended"
        except StageFailure as exc:  # the talker broke the protocol: fail and stop it
            self._fail(exc)
            return
        except asyncio.CancelledError:
            raise
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                self._fail(
                    StageFailure("DEADLINE_EXCEEDED", f"talker {self.address}: request deadline passed")
                )
                return
            reason = f"{exc.code().name}: {exc.details()}"
        except Exception as exc:  # noqa: BLE001 - a bug here must fail this request, not hang it
            self._mishandled(exc)
            return
        await self._broken(reason)

    def _mishandled(self, exc: Exception) -> None:
        """Handling one of the talker's messages raised: a protocol error fails this request as itself, a
        bug as INTERNAL (logged); the reader and a link's ``take`` alike."""
        if isinstance(exc, StageFailure):
            self._fail(exc)
            return
        log.exception("relay to talker %s failed", self.address)
        self._fail(StageFailure("INTERNAL", f"codec relay: {type(exc).__name__}: {exc}"))

    def _on_opened(self, opened: S.StreamOpened) -> None:
        if self.opened.done():
            raise StageFailure("INVALID_ARGUMENT", f"talker {self.address} sent opened twice")
        current = hello_from_proto(opened.transport)
        if current.probe_region != self.probe:
            self.pool.refresh(self.peer, current)  # restarted behind the same address
            self.probe, self.shm_ok = current.probe_region, False
        self.opened.set_result(opened)

    def _frames(self, f: S.CodecFrames) -> None:
        metrics.observe_hop("talker", "codec", f.sent_unix_ns)
        codes = self._accept(f)
        if codes is not None:
            self._deliver(f, codes)

    def _accept(self, f: S.CodecFrames) -> np.ndarray | None:
        """The frames' codes, checked against the protocol and counted (credit, timers); None: dropped."""
        if self.done:
            return None  # sent before our cancel reached the talker: dropped unread (its slots went back too)
        if not self.opened.done():
            raise StageFailure("INVALID_ARGUMENT", f"talker {self.address} sent frames before opened")
        n = f.frame_count
        if not 0 < n <= self.outstanding:
            raise StageFailure(
                "INVALID_ARGUMENT", f"talker {self.address} sent {n} frames holding {self.outstanding} credit"
            )
        if f.first_frame != self.received:
            raise StageFailure(
                "INVALID_ARGUMENT", f"frames.first_frame is {f.first_frame}; expected {self.received}"
            )
        try:
            data, ref = read_payload(f.codes, self.pool.reader if self.shm_ok else None)
        except StaleShmReference as exc:
            raise StageFailure("DATA_LOSS", f"frames.codes: {exc}") from exc
        except (InvalidShmReference, ShmError) as exc:
            raise StageFailure("INVALID_ARGUMENT", f"frames.codes: {exc}") from exc
        if ref is not None and not self.half_closed:
            self._send(S.TalkerStreamRequest(shm_ack=ack_message([ref])))
        codes = wire.codes_from_bytes(
            data, n, f.num_groups, field="frames.codes", codebook_size=self.stream.rt.codebook_size
        )
        self.outstanding -= n
        self.received += n
        if self._first is not None:
            self._first.cancel()
            self._first = None
        self._rearm_stall()
        return codes

    def _deliver(self, f: S.CodecFrames, codes: np.ndarray) -> None:
        self.stream.frames_in(codes)

    async def _segment_done(self, done: S.SegmentDone) -> None:
        """A take ended (text-to-speech segments); the duplex relay keeps only the last one."""
        if not self.done:
            await self.stream.segment_in(done)

    def _on_other(self, resp: S.TalkerStreamResponse) -> None:
        """A message text-to-speech streams do not use (duplex: user-code credit)."""

    async def _on_terminal(self, eos: S.EndOfStream) -> None:
        self.done = True
        self._stop_timers()
        self._half_close()
        if eos.timings.HasField("queued"):
            self.queued_s = eos.timings.queued.ToNanoseconds() / 1e9
        if not self.opened.done():
            error = (
                eos.error
                if eos.reason == S.END_REASON_ERROR
                else wire.stream_error(
                    "UNAVAILABLE", f"talker {self.address} ended the stream before opened", "codec"
                )
            )
            self.opened.set_exception(TalkerRefused(error))
            return
        await self.stream.talker_ended(eos, self.segment_done)

    async def _broken(self, reason: str) -> None:
        was_done, self.done = self.done, True
        self._stop_timers()
        if was_done:
            return  # we cancelled it, or it already ended: nothing is owed
        if getattr(self.call, "link_broken", True):
            # The talker's connection failed (a call of its own, or the link every request shares): dial
            # afresh next time. One request's call on a healthy link ending badly fails that request alone.
            self.pool.drop(self.peer)
        if self.shm_ok or self.probe:
            await self.pool.reap(self.probe)
        self._fail(
            StageFailure(
                "UNAVAILABLE", f"talker {self.address} ended the stream without end_of_stream ({reason})"
            )
        )

    def _fail(self, exc: StageFailure) -> None:
        if not self.opened.done():
            self.opened.set_exception(exc)
        else:
            self.stream.fail(exc.code, exc.message)
        self.cancel(exc.message)

    # -- timeouts (docs/protocol.md §8) ----------------------------------------------------------------
    def _rearm_stall(self) -> None:
        """Restart the stall clock. It runs only while the talker owes output: it holds credit and has all
        its input. One timer checks the clock when it could run out, rather than a timer cancelled and made
        anew for every message (a frame of every stream each talker tick)."""
        if self.done:
            return
        loop = asyncio.get_running_loop()
        self._stall_from = loop.time()
        if self._stall is None and self._owes_output():
            self._stall = loop.call_later(self.stall_timeout, self._check_stall)

    def _owes_output(self) -> bool:
        return bool(self.received and self.eoi_sent and self.outstanding > 0)

    def _check_stall(self) -> None:
        self._stall = None
        if self.done or not self._owes_output():
            return  # the next restart of the clock while it owes output sets a timer again
        loop = asyncio.get_running_loop()
        left = self._stall_from + self.stall_timeout - loop.time()
        if left > 0:
            self._stall = loop.call_later(left, self._check_stall)
        else:
            self._expired("stall")

    def _expired(self, which: str) -> None:
        if self.done:
            return
        if which == "first":
            what = (
                f"no codec frame from talker {self.address} within {self.first_timeout:g} s of input "
                "(first-chunk timeout = connector_get_max_wait_first_chunk x connector_get_sleep_s)"
            )
        else:
            what = (
                f"talker {self.address} sent nothing for {self.stall_timeout:g} s while holding credit "
                "(stall timeout = connector_get_max_wait x connector_get_sleep_s)"
            )
        self.stream.fail("DEADLINE_EXCEEDED", what)

    def _stop_timers(self) -> None:
        for handle in (self._first, self._stall):
            if handle is not None:
                handle.cancel()
        self._first = self._stall = None

    def close(self) -> None:
        """The codec stream is done: make sure the talker call ends and its tasks do not outlive it."""
        self._stop_timers()
        if self.call is None:
            return
        if not self.done:
            self.cancel("codec stream closed")
        task = asyncio.ensure_future(self._reap_call(time.monotonic() + CANCEL_GRACE_S))
        _background.add(task)
        task.add_done_callback(_background.discard)

    async def _reap_call(self, deadline: float) -> None:
        # Give the talker its chance to answer the cancel (so it logs a clean CANCELLED), then tear down.
        remaining = max(deadline - time.monotonic(), 0.0)
        _, pending = await asyncio.wait(self.tasks, timeout=remaining)
        if pending:
            assert self.call is not None
            self.call.cancel()
            for task in pending:
                task.cancel()
