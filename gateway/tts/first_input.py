"""The client's first input, read while its stream opens, so that a text already in hand rides in the open.

A request's text went to the codec only once the stages had answered ``opened``: a round trip through
gateway, codec and talker on the way to first audio (about 5 ms on the CI box, most of the 9 ms between the
client's time to first audio and the gateway's; docs/benchmarks.md). The input is now read ahead as the
stream opens, the open waiting a moment for it (``settle``): when its first item has arrived by the time
``open`` is written and is a text the pump would pass, it goes inside the open (``StreamOpen.initial_text``,
docs/protocol.md §2), and so does the end of input when it came right after that text (a whole-text
request: HTTP, ``Synthesize``, a gRPC stream written at once). The codec hands both to the talker inside
the talker's open. Anything else (no text yet, a flush first, a text the pump refuses,
sentence auto-flush, which splits texts) goes the usual way after ``opened``. A retried open carries the same.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterable, AsyncIterator, Callable
from typing import Any, Generic, TypeVar

from gateway.errors import GatewayError

_END = object()
# How long an open waits for the client's first text and its end (``settle``). A client that writes its
# config and text together (gRPC StreamingSynthesize) has both read within a few loop turns, and a text in
# the open saves its own trip through codec and talker behind it (about 3 ms on an H200 box, where the
# text came a second message after the open) and, for an in-context clone, whose prompt needs the whole
# text or enough of it, the wait for the end of input. A client whose text comes later (an LLM's deltas)
# loses at most this much of the open's overlap with it.
SETTLE_S = 0.002
T = TypeVar("T")  # an input: a text (str) or what else the pump takes (a flush)


class FirstInput(Generic[T]):
    def __init__(
        self, inputs: AsyncIterable[T], check: Callable[[str], None], *, enabled: bool = True
    ) -> None:
        loop = asyncio.get_running_loop()
        self._items = aiter(inputs)
        # The first item, and after a first text the second: the end (_END) makes a whole-text request.
        self._ahead: tuple[asyncio.Future[Any], asyncio.Future[Any]] = (
            loop.create_future(),
            loop.create_future(),
        )
        self._reader = asyncio.ensure_future(self._read_ahead())
        self._check = check
        self._enabled = enabled
        self._offered: tuple[str, bool, float] = ("", False, 0.0)
        self.sent: str | None = None  # the text the open carried (the pump does not send it again)
        self.sent_at = 0.0  # when that open was written: the text's segment starts then
        self.ended_in_open = False  # the open carried the end of input too

    async def _read_ahead(self) -> None:
        for i, future in enumerate(self._ahead):
            try:
                item = await anext(self._items, _END)
            except Exception as exc:  # the client's iterator failed: the pump raises it in its turn
                future.set_exception(exc)
                return
            future.set_result(item)
            if i == 0 and not isinstance(item, str):
                return  # only a first text is read past

    async def settle(self, timeout_s: float = SETTLE_S) -> None:
        """Give the client's first input (and, after a first text, the next item: the end of a whole-text
        request) up to ``timeout_s`` to arrive before the open is written."""
        if not self._enabled:
            return
        first, second = self._ahead
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                await asyncio.wait([first])
                if isinstance(_value(first), str):
                    await asyncio.wait([second])

    def for_open(self) -> tuple[str, bool]:
        """``(text, input ended)`` for the open written now (``("", False)``: nothing rides in it)."""
        text, ended = "", False
        first, second = self._ahead
        if self._enabled and _value(first) is not None:
            item = first.result()
            if isinstance(item, str) and item.strip():
                try:
                    self._check(item)
                    text, ended = item, _value(second) is _END
                except GatewayError:
                    pass  # the pump refuses it, with the same error, after `opened`
        self._offered = (text, ended, time.monotonic())
        return text, ended

    def opened(self) -> None:
        """The last open written is the one the stages answered."""
        text, ended, at = self._offered
        self.sent, self.ended_in_open, self.sent_at = (text, ended, at) if text else (None, False, 0.0)

    async def items(self) -> AsyncIterator[T]:
        """Every input, the first one included (the pump skips ``sent``, which is that same object)."""
        first = await self._ahead[0]
        if first is _END:
            return
        yield first
        if isinstance(first, str):
            second = await self._ahead[1]
            if second is _END:
                return
            yield second
        async for item in self._items:
            yield item

    def close(self) -> None:
        self._reader.cancel()
        for future in self._ahead:
            if not future.done():
                future.cancel()
            elif not future.cancelled():
                future.exception()  # retrieved: the pump that would have raised it may never run


def _value(future: asyncio.Future[Any]) -> Any:
    """The future's item if it holds one; None while pending or when it failed."""
    if not future.done() or future.cancelled() or future.exception() is not None:
        return None
    return future.result()
