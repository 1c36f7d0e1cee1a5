"""What one Stream call's protocol state has in common on the talker and the codec, text-to-speech and
duplex alike: the read loop over the upstream peer's messages (protocol errors in-band, a bug as INTERNAL on
this stream only, a broken call as UNAVAILABLE, late shm acks after the terminal), the one message-dispatch
skeleton (``_handle``: ``open`` first and once, credit in the stage's unit, shm acks, cancel, the other
mode's requests refused), the checks every ``open`` gets, and the ``opened`` reply with the transport
negotiation (docs/protocol.md §2-§3).

A stream subclasses ``StageStream`` and supplies ``_open``, ``_input`` (its mode's own requests),
``_grant`` (credit), ``_cancel``, ``fail`` (an in-band error terminal), ``close`` and ``state``. Lives on
the event loop; imports no torch.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from voxstage import wire
from voxstage.internal.v1 import stage_pb2
from voxstage.loans import StreamLoans
from voxstage.quote import quoted
from voxstage.stage.errors import StageFailure
from voxstage.transport.host import local_hello, verify_peer
from voxstage.transport.payload import hello_from_proto, hello_to_proto

if TYPE_CHECKING:
    from voxstage.transport.shm import ShmWriter


class ServingState(Protocol):
    """What an ``open`` checks of its stage (a ``StageServicer``; typed here so this module, which the
    servicer imports, does not import it back)."""

    @property
    def ready(self) -> bool: ...

    @property
    def draining(self) -> bool: ...


class StageIdentity(Protocol):
    """What a stage's ``opened`` says it serves (the talker's servicer, the codec's runtime)."""

    @property
    def model(self) -> str: ...

    @property
    def family(self) -> str: ...

    @property
    def num_groups(self) -> int: ...

    @property
    def frame_rate_hz(self) -> float: ...


class Outbox:
    """A stream's outgoing messages, in order. The Stream handler drains the queue onto its call. On a link,
    once ``sink`` is set, a message goes straight into the link's next batch when nothing waits in the queue
    before it, without a turn of the event loop per message. The terminal always goes through the queue
    (the handler's cleanup follows it), and nothing goes straight out after it."""

    def __init__(self) -> None:
        self._queue: asyncio.Queue[Any] = asyncio.Queue()
        self.sink: Callable[[Any], None] | None = None

    def put_nowait(self, msg: Any) -> None:
        sink = self.sink
        if sink is not None:
            if msg.HasField("end_of_stream"):
                self.sink = None
            elif self._queue.empty():
                sink(msg)
                return
        self._queue.put_nowait(msg)

    async def get(self) -> Any:
        return await self._queue.get()


class StageStream:
    role: ClassVar[str]  # "talker" / "codec": this stage, in error messages and as their origin
    peer: ClassVar[str]  # who sends this stream's requests: "codec" / "gateway"
    credit_unit: ClassVar[int]  # stage_pb2.CreditUnit the peer grants in: FRAMES (talker), SAMPLES (codec)
    # Requests of the other mode (text-to-speech / duplex), refused as FAILED_PRECONDITION: kind -> why.
    refused: ClassVar[Mapping[str, str]] = {}

    def __init__(self, key: str) -> None:
        self.key = key  # engine id: unique even if two callers reuse a request_id
        self.request_id = ""
        self.outbox = Outbox()
        self.opened = self.end_of_input = self.cancel_requested = self.terminal_sent = False
        self.loans = StreamLoans(None)
        self.on_link = False  # set by the servicer: this request rides a stage link (docs/protocol.md §12)
        self.t_open = time.perf_counter()
        self.t_first: float | None = None

    # -- hooks -------------------------------------------------------------------------------------------
    async def _open(self, op: stage_pb2.StreamOpen) -> None:
        """The first message: validate, admit, answer ``opened`` (or an in-band error)."""
        raise NotImplementedError

    async def _input(self, kind: str, msg: Any) -> bool:
        """One of this mode's own requests after ``open`` (text, flush, user audio, end_of_input...);
        False when ``kind`` is none of them."""
        raise NotImplementedError

    def _grant(self, amount: int) -> None:
        """The peer granted ``amount`` more units of output."""
        raise NotImplementedError

    def _cancel(self, cancel: stage_pb2.Cancel) -> None:
        """The peer cancelled (``cancel_requested`` is set and the shm loans are forfeit)."""
        raise NotImplementedError

    def fail(self, code: str, message: str) -> None:
        """End the stream with an in-band error (no-op once the terminal is queued)."""
        raise NotImplementedError

    def close(self) -> None:
        """The handler is returning: free everything the stream holds."""
        raise NotImplementedError

    def state(self, view: Mapping[str, Any], tick: int) -> stage_pb2.RequestState:
        """This stream in Status; ``view`` is the stage's per-stream part of the engine snapshot."""
        raise NotImplementedError

    def _response(self, **fields: Any) -> Any:
        """The stage's response message (``TalkerStreamResponse`` / ``CodecStreamResponse``)."""
        raise NotImplementedError

    # -- the terminal fence ----------------------------------------------------------------------------------
    def _send_terminal(
        self,
        reason: int,
        error: stage_pb2.StreamError | None,
        *,
        frames: int,
        samples: int = 0,
        queued: float | None,
    ) -> None:
        """Queue ``end_of_stream`` behind everything queued before it (docs/protocol.md §5), with the counts
        and the per-stage timings since ``open``; ``queued`` is open -> slot, when known."""
        self.terminal_sent = True
        first = None if self.t_first is None else self.t_first - self.t_open
        eos = wire.end_of_stream(
            reason,
            frames=frames,
            samples=samples,
            error=error,
            stage_timings=wire.timings(queued, first, time.perf_counter() - self.t_open),
        )
        self.outbox.put_nowait(self._response(end_of_stream=eos))

    # -- peer -> this stage ------------------------------------------------------------------------------
    def _input_now(self, kind: str, msg: Any) -> bool:
        """One of this mode's own requests whose handling never waits (user audio, user codes), handled
        now; False when ``kind`` is none of them (then ``_input`` gets it)."""
        return False

    def _handle_now(self, kind: str, msg: Any) -> bool:
        """A request after ``open`` whose handling never waits (credit, shm acks, ``_input_now``'s), handled
        now; False when ``kind`` is none of them. Raises ``StageFailure`` for a protocol error."""
        if kind == "credit":
            if msg.credit.unit != self.credit_unit:
                unit = stage_pb2.CreditUnit.Name(self.credit_unit).removeprefix("CREDIT_UNIT_")
                raise StageFailure("INVALID_ARGUMENT", f"credit.unit: the {self.role} stream counts {unit}")
            self._grant(msg.credit.amount)
        elif kind == "shm_ack":
            self.loans.ack(msg.shm_ack)
        else:
            return self._input_now(kind, msg)
        return True

    def take(self, msg: Any) -> bool:
        """On a link, a message the read loop would handle next, handled at once when its handling never
        waits: the link calls this only while the read loop waits on an empty inbox, so the order is the
        one the loop keeps, without a turn of the event loop per message. False: the loop takes it."""
        if not self.opened or self.terminal_sent:
            return False
        try:
            return self._handle_now(msg.WhichOneof("request"), msg)
        except Exception as exc:  # noqa: BLE001 - a protocol error or a bug ends this stream only
            self._failed(exc)
            return True

    async def _handle(self, msg: Any) -> None:
        """One request message; raises ``StageFailure`` for a protocol error."""
        kind = msg.WhichOneof("request")
        if not self.opened:
            if kind != "open":
                raise StageFailure("INVALID_ARGUMENT", f"first message must be open, got {kind}")
            await self._open(msg.open)
        elif kind == "open":
            raise StageFailure("INVALID_ARGUMENT", "open: sent twice on one stream")
        elif self._handle_now(kind, msg):
            pass
        elif kind == "cancel":
            self.cancel_requested = True
            self.loans.forfeit()
            self._cancel(msg.cancel)
        elif kind in self.refused:
            raise StageFailure("FAILED_PRECONDITION", f"{kind}: {self.refused[kind]}")
        elif not await self._input(kind, msg):
            raise StageFailure("INVALID_ARGUMENT", f"unknown request {kind!r}")

    async def read(self, requests: AsyncIterator[Any]) -> None:
        """Consume the peer's messages until half-close. Protocol errors end the stream in-band; a bug
        while handling one is reported as INTERNAL on this stream only; a broken call as UNAVAILABLE."""
        messages = aiter(requests)
        while True:
            try:
                msg = await anext(messages)
            except StopAsyncIteration:
                break
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - the call broke under us: the peer is gone
                self.fail("UNAVAILABLE", f"{self.peer} stream broke: {exc}")
                return
            if self.terminal_sent:
                if msg.WhichOneof("request") == "shm_ack":
                    self.loans.late_ack(msg.shm_ack)  # frees slots the peer copied out late
                continue
            try:
                await self._handle(msg)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - one request's bug must not reach the others
                self._failed(exc)
        if not self.terminal_sent and not (self.end_of_input or self.cancel_requested):
            self.fail("INVALID_ARGUMENT", "stream half-closed before end_of_input or cancel")

    def _failed(self, exc: Exception) -> None:
        """Handling a message raised: a protocol error ends the stream in-band as itself, a bug as INTERNAL
        (logged); either way this stream only."""
        if isinstance(exc, StageFailure):
            self.fail(exc.code, exc.message)
            return
        # On the stage's own logger (its name is in the log line), not this module's.
        logging.getLogger(type(self).__module__).exception("%s stream %s failed", self.role, self.request_id)
        self.fail("INTERNAL", f"{self.role}: {type(exc).__name__}: {exc}")

    # -- open ----------------------------------------------------------------------------------------------
    def _admit(
        self,
        op: stage_pb2.StreamOpen,
        srv: ServingState,
        *,
        model: str,
        family: str,
        duplex: bool = False,
    ) -> None:
        """The checks before anything else of an ``open``: the stage serves, the mode and the model."""
        self.request_id = op.request_id
        if srv.draining or not srv.ready:
            raise StageFailure("UNAVAILABLE", f"{self.role} is {'draining' if srv.draining else 'not ready'}")
        if duplex and op.mode != stage_pb2.STREAM_MODE_DUPLEX:
            raise StageFailure("FAILED_PRECONDITION", f"mode: {family} serves duplex streams only")
        if not duplex and op.mode not in (stage_pb2.STREAM_MODE_UNSPECIFIED, stage_pb2.STREAM_MODE_TTS):
            raise StageFailure("FAILED_PRECONDITION", f"mode: {family} serves text-to-speech streams only")
        if duplex and (op.initial_text or op.initial_end_of_input):
            raise StageFailure("INVALID_ARGUMENT", "initial_text: duplex streams carry no text")
        if op.initial_end_of_input and not op.initial_text.strip():
            raise StageFailure("INVALID_ARGUMENT", "initial_end_of_input: needs the text (initial_text)")
        if op.model and op.model != model:
            why = f"model: this {self.role} serves {model!r}, not {quoted(op.model)}"
            raise StageFailure("NOT_FOUND", why)

    def _lend_shm(self, writer: ShmWriter | None, op: stage_pb2.StreamOpen) -> None:
        """Payloads go through shared memory only where the peer proved it can read our regions; on a link
        they go inline in the request's messages and the link moves the tick's slab (§12)."""
        if self.on_link:
            self.loans = StreamLoans(None, counted=False)
        elif writer is not None:
            readable = writer.peer_can_read(op.transport.verified_peer_probe)
            self.loans = StreamLoans(writer.sender(peer_readable=readable))

    def _send_opened(self, op: stage_pb2.StreamOpen, identity: StageIdentity, **fields: Any) -> None:
        """The ``opened`` reply: the stage's identity and whatever the mode adds (schedule, format, credit,
        transport); the stream is open from here on."""
        self.opened = True
        opened = stage_pb2.StreamOpened(
            request_id=op.request_id,
            model=identity.model,
            family=identity.family,
            num_code_groups=identity.num_groups,
            frame_rate_hz=identity.frame_rate_hz,
            **fields,
        )
        self.outbox.put_nowait(self._response(opened=opened))

    @staticmethod
    def _hello(writer: ShmWriter | None, op: stage_pb2.StreamOpen) -> stage_pb2.TransportHello:
        """Our side of the transport negotiation for ``opened``, with the verdict on the peer's probe."""
        return hello_to_proto(
            local_hello(
                probe_region=writer.probe_region if writer else "",
                shm_threshold_bytes=writer.threshold_bytes if writer else 0,
                verified_peer_probe=verify_peer(hello_from_proto(op.transport)),
            )
        )
