"""The bound on a full-duplex client that keeps its connection open but stops reading.

Agent audio leaves through the face's write (``context.write`` for ``Converse``, the WebSocket send for
``/v1/realtime``), which waits while the client's flow-control window or socket buffer is full. The session
hands the codec its next agent credit only after a write, so such a client stops the session; but nothing
ended it, and its admission slot, talker slot and codec stream stayed held until the client disconnected.
Every write of a duplex face goes through ``bounded_send``: one that cannot finish within
``gateway.duplex_send_timeout_s`` raises ``SendStalled``, and the face then frees the session at once and
tells the client why where the connection still lets it (gRPC: DEADLINE_EXCEEDED; WebSocket: an ``error``
event, then close code 1008).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Iterable

import grpc

from gateway.errors import GatewayError
from voxstage import metrics

log = logging.getLogger(__name__)

REASON = "session_send_timeout"
KEY = "gateway.duplex_send_timeout_s"


class SendStalled(Exception):
    """A write to the client did not finish in time: the session must end now. Not a GatewayError on
    purpose: the faces answer a GatewayError from a client event in-band, with yet another write."""

    def __init__(self, error: GatewayError) -> None:
        super().__init__(error.text)
        self.error = error


def stalled_error(limit_s: float) -> GatewayError:
    return GatewayError(
        grpc.StatusCode.DEADLINE_EXCEEDED,
        f"the client took no session event for {limit_s:g} s ({KEY}): the session is closed and its "
        "slots freed; read the agent's audio as it comes",
        reason=REASON,
    )


async def bounded_send(write: Awaitable[None], limit_s: float) -> None:
    """``write``, or ``SendStalled`` once it has waited ``limit_s`` (the write is cancelled)."""
    try:
        async with asyncio.timeout(limit_s):
            await write
    except TimeoutError:
        raise SendStalled(stalled_error(limit_s)) from None


def stalled_in(tasks: Iterable[asyncio.Task[object]]) -> SendStalled | None:
    """The ``SendStalled`` one of the finished ``tasks`` raised, if any."""
    for task in tasks:
        if task.done() and not task.cancelled() and isinstance(task.exception(), SendStalled):
            return task.exception()  # type: ignore[return-value]
    return None


def count_stalled(session_id: str, face: str, limit_s: float) -> None:
    """Once per session, when its face gives up on the client."""
    metrics.DUPLEX_ENDED.labels(reason="send_timeout").inc()
    log.warning(
        "%s %s: the client took no event for %g s (%s): session closed, slots freed",
        face, session_id, limit_s, KEY,
    )  # fmt: skip
