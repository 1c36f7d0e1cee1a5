"""Issue 15: the HTTP face bounds clients that hold a connection without sending a whole request.

Raw sockets, since a well-behaved client cannot send half a request head or a body shorter than its
Content-Length: partial heads are closed (408) within ``http_header_timeout_s``, an oversized head gets 431,
a stalled body 408 within ``http_body_timeout_s``, and an idle keep-alive connection closes after
``http_keep_alive_timeout_s``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import socket
import time

import httpx
import pytest
from gateway_fakes import FakeCodec, expected_samples
from gateway_kit import MakeStack, Stack, until

HEAD = b"Host: gateway\r\nUser-Agent: raw\r\n"


async def exchange(port: int, *parts: bytes, wait_s: float = 4.0) -> tuple[bytes, float]:
    """Send ``parts`` (the last one may stop mid-request), then read until the server closes: what came
    back, and the seconds from the last send to the close (``inf`` when still open after ``wait_s``)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    got = b""
    try:
        for part in parts:
            writer.write(part)
            await writer.drain()
            if part is not parts[-1]:
                got += await _response(reader)
        start = time.monotonic()
        try:
            async with asyncio.timeout(wait_s):
                while chunk := await reader.read(65536):
                    got += chunk
        except TimeoutError:
            return got, math.inf
        return got, time.monotonic() - start
    finally:
        writer.close()


async def _response(reader: asyncio.StreamReader) -> bytes:
    """One whole response with a Content-Length body (a complete request sent before the one under test)."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(
        int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")
    )
    return head + await reader.readexactly(length)


async def test_partial_headers_are_closed_in_time(make_stack: MakeStack) -> None:
    stack = await make_stack(overrides=["gateway.http_header_timeout_s=0.5"])
    port = stack.gateway.http_port
    got, seconds = await exchange(port, b"POST /v1/audio/speech HTTP/1.1\r\nHost: gateway\r\nContent-Ty")
    assert got.startswith(b"HTTP/1.1 408") and b"gateway.http_header_timeout_s" in got
    assert 0.4 < seconds < 2.0
    _, seconds = await exchange(port, b"")  # connects, never sends a byte
    assert seconds < 2.0
    # On a kept-alive connection the clock starts at the next request's first byte.
    got, seconds = await exchange(port, b"GET /v1/models HTTP/1.1\r\n" + HEAD + b"\r\n", b"GET /v1/mod")
    assert got.startswith(b"HTTP/1.1 200") and b"HTTP/1.1 408" in got and seconds < 2.0


async def test_oversized_headers_get_431(make_stack: MakeStack) -> None:
    stack = await make_stack(overrides=["gateway.http_max_header_bytes=4096"])
    port = stack.gateway.http_port
    small = b"X-Pad: " + b"a" * 2048 + b"\r\n"
    close = b"Connection: close\r\n\r\n"
    got, _ = await exchange(port, b"GET /v1/models HTTP/1.1\r\n" + HEAD + small + close)
    assert got.startswith(b"HTTP/1.1 200")
    large = b"X-Pad: " + b"a" * 8192 + b"\r\n"
    got, seconds = await exchange(port, b"GET /v1/models HTTP/1.1\r\n" + HEAD + large + b"\r\n")
    assert got.startswith(b"HTTP/1.1 431") and b"gateway.http_max_header_bytes" in got
    assert seconds < 2.0  # and the connection is closed


async def test_a_stalled_body_gets_408_in_time(make_stack: MakeStack) -> None:
    stack = await make_stack(overrides=["gateway.http_body_timeout_s=0.5"])
    head = b"POST /v1/audio/speech HTTP/1.1\r\n" + HEAD + b"Content-Type: application/json\r\n"
    got, seconds = await exchange(
        stack.gateway.http_port, head + b"Content-Length: 100\r\n\r\n" + b'{"input": "'
    )  # 11 of the 100 bytes the head promised
    assert got.startswith(b"HTTP/1.1 408")
    head_part, _, body = got.partition(b"\r\n\r\n")
    assert b"connection: close" in head_part.lower()
    error = json.loads(body)["error"]
    assert error["code"] == "body_timeout" and "gateway.http_body_timeout_s" in error["message"]
    assert 0.4 < seconds < 2.0  # answered and closed
    await asyncio.sleep(0.05)
    assert stack.gateway.core.admission.active == 0 and stack.codec.opens == []


async def test_idle_keep_alive_connection_closes(make_stack: MakeStack) -> None:
    stack = await make_stack(overrides=["gateway.http_keep_alive_timeout_s=1"])
    got, seconds = await exchange(stack.gateway.http_port, b"GET /v1/models HTTP/1.1\r\n" + HEAD + b"\r\n")
    assert got.startswith(b"HTTP/1.1 200")
    assert 0.8 < seconds < 2.5


async def test_a_long_streamed_response_outlives_the_body_timeout(make_stack: MakeStack) -> None:
    # The body timeout covers reading the body only; a streaming response also waits on `receive` (for the
    # client's disconnect) for as long as it runs, and that wait must stay untimed.
    stack = await make_stack(FakeCodec(frame_delay_s=0.03), overrides=["gateway.http_body_timeout_s=0.3"])
    text = "z" * 40  # 1.2 s of generation
    async with httpx.AsyncClient(base_url=stack.http_url, timeout=10) as http:
        body = {"input": text, "stream": True, "response_format": "pcm"}
        reply = await http.post("/v1/audio/speech", json=body)
    assert reply.status_code == 200 and len(reply.content) == 2 * expected_samples(text)


def released(stack: Stack) -> bool:
    core = stack.gateway.core
    return stack.codec.active == 0 and core.admission.active == 0


class UvicornErrors(logging.Handler):
    """What uvicorn logs at ERROR: its loggers do not propagate to the root, where caplog listens, and its
    start reconfigures them (dictConfig drops their handlers), so this is attached once the stack runs."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())

    @classmethod
    def attach(cls) -> UvicornErrors:
        handler = cls()
        logging.getLogger("uvicorn.error").addHandler(handler)
        return handler

    def detach(self) -> list[str]:
        logging.getLogger("uvicorn.error").removeHandler(self)
        return self.lines


async def test_a_streamed_response_nobody_reads_frees_its_slot(
    make_stack: MakeStack, caplog: pytest.LogCaptureFixture
) -> None:
    # About 30 MB of float PCM, far more than the socket buffers hold: uvicorn's writes stall for good.
    stack = await make_stack(FakeCodec(frames_per_char=10), overrides=["gateway.stream_idle_timeout_s=0.5"])
    uvicorn_errors = UvicornErrors.attach()
    body = json.dumps({"input": "y" * 400, "stream": True, "response_format": "pcm_f32"}).encode()
    head = f"POST /v1/audio/speech HTTP/1.1\r\nHost: gateway\r\nContent-Length: {len(body)}\r\n\r\n"
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a client that reads nothing, buffers little
    sock.setblocking(False)
    loop = asyncio.get_running_loop()
    try:
        await loop.sock_connect(sock, ("127.0.0.1", stack.gateway.http_port))
        await loop.sock_sendall(sock, head.encode() + body)
        await until(lambda: stack.codec.active == 1)
        await until(lambda: stack.codec.cancels == 1 and released(stack), limit_s=8.0)
    finally:
        sock.close()
    await asyncio.sleep(0.2)
    # Freed from inside the request's own generators, as for a client that left: no generator left to the
    # garbage collector, whose concurrent closes log "already running" tracebacks.
    assert not [r.getMessage() for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]
    # Issue 26: the cut is the gateway's own doing, not an app that forgot its response.
    assert not uvicorn_errors.detach(), uvicorn_errors.lines


async def test_lifetime_limit_ends_http_requests(make_stack: MakeStack) -> None:
    stack = await make_stack(FakeCodec(frame_delay_s=0.05), overrides=["gateway.max_stream_lifetime_s=0.8"])
    uvicorn_errors = UvicornErrors.attach()
    text = "w" * 60  # 3 s of generation
    async with httpx.AsyncClient(base_url=stack.http_url, timeout=10) as http:
        start = time.monotonic()
        body = {"input": text, "stream": True, "response_format": "pcm"}
        async with http.stream("POST", "/v1/audio/speech", json=body) as reply:
            assert reply.status_code == 200
            with pytest.raises(httpx.RemoteProtocolError):  # cut, so the client can tell
                async for _ in reply.aiter_raw():
                    pass
        assert time.monotonic() - start < 2.5
        await until(lambda: stack.codec.cancels == 1 and released(stack))
        whole = await http.post(
            "/v1/audio/speech", json={"input": text, "response_format": "pcm", "stream": False}
        )
    assert whole.status_code == 504 and "gateway.max_stream_lifetime_s" in whole.json()["error"]["message"]
    await until(lambda: stack.codec.cancels == 2 and released(stack))
    assert not uvicorn_errors.detach(), uvicorn_errors.lines  # issue 26: no "returned without completing"
