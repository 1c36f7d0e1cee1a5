"""A client that leaves mid-request is routine on a public port: one short log line, never a traceback.

Raw sockets, because an HTTP client library finishes what it started; the operator's probe (issue 15) cut
a streamed response short and sent a body shorter than its Content-Length.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Iterator

import httpx
import pytest
from gateway_fakes import FAIL_MARKER, FakeCodec
from gateway_kit import MakeStack, Stack


@pytest.fixture
def watch_logs(caplog: pytest.LogCaptureFixture) -> Iterator[Callable[[], None]]:
    """Call once the stack runs. caplog listens at the root, but uvicorn's "Exception in ASGI application"
    goes to ``uvicorn.error``, which propagates only up to ``uvicorn``, whose handlers uvicorn's logging
    setup resets when the stack starts."""
    uvicorn_log = logging.getLogger("uvicorn")

    def attach() -> None:
        caplog.set_level(logging.DEBUG)
        uvicorn_log.addHandler(caplog.handler)

    yield attach
    uvicorn_log.removeHandler(caplog.handler)


def _tracebacks(caplog: pytest.LogCaptureFixture) -> list[str]:
    # The HTTP stack's loggers only: grpc.aio's poller sometimes logs through asyncio when many event loops
    # come and go in one test process, which is no business of these tests.
    return [
        f"{r.name}: {r.getMessage()}"
        for r in caplog.records
        if r.name.startswith(("voxstage", "uvicorn", "starlette", "fastapi"))
        and (r.exc_info or "Traceback" in r.getMessage() or "Exception in ASGI" in r.getMessage())
    ]


async def _still_serves(stack: Stack) -> None:
    async with httpx.AsyncClient(base_url=stack.http_url) as http:
        r = await http.post("/v1/audio/speech", json={"input": "ok", "response_format": "pcm"})
        assert r.status_code == 200 and r.content


def _request(body: bytes, *, declared: int | None = None) -> bytes:
    head = (
        "POST /v1/audio/speech HTTP/1.1\r\nHost: gateway\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body) if declared is None else declared}\r\n\r\n"
    )
    return head.encode() + body


async def test_client_leaving_mid_stream_logs_no_traceback(
    make_stack: MakeStack, caplog: pytest.LogCaptureFixture, watch_logs: Callable[[], None]
) -> None:
    stack = await make_stack(FakeCodec(frame_delay_s=0.02))
    watch_logs()
    body = json.dumps({"input": "z" * 60, "stream": True, "response_format": "pcm"}).encode()
    for _ in range(3):  # the race between the write and the disconnect differs from run to run
        reader, writer = await asyncio.open_connection("127.0.0.1", stack.gateway.http_port)
        writer.write(_request(body))
        await writer.drain()
        got = await reader.readuntil(b"\r\n\r\n")
        assert b" 200 " in got.split(b"\r\n", 1)[0]
        await reader.read(4096)  # some audio has flowed
        writer.transport.abort()  # RST, no goodbye
        await asyncio.sleep(0.3)
    await asyncio.sleep(0.5)
    await _still_serves(stack)
    assert not _tracebacks(caplog), _tracebacks(caplog)
    assert stack.codec.cancels >= 3  # the abandoned streams were stopped upstream
    left = [r for r in caplog.records if "client disconnected mid-stream" in r.getMessage()]
    assert len(left) == 3 and all(r.levelno == logging.INFO for r in left)  # one line each


async def test_body_shorter_than_content_length_logs_no_traceback(
    make_stack: MakeStack, caplog: pytest.LogCaptureFixture, watch_logs: Callable[[], None]
) -> None:
    stack = await make_stack()
    watch_logs()
    body = json.dumps({"input": "hello", "response_format": "pcm"}).encode()
    reader, writer = await asyncio.open_connection("127.0.0.1", stack.gateway.http_port)
    writer.write(_request(body[:10], declared=len(body)))
    await writer.drain()
    await asyncio.sleep(0.1)
    writer.close()  # the rest of the body never comes
    await asyncio.sleep(0.5)
    await _still_serves(stack)
    assert not _tracebacks(caplog), _tracebacks(caplog)
    assert any("disconnected" in r.getMessage() and r.levelno <= logging.INFO for r in caplog.records)


async def test_a_stream_cut_on_failure_is_one_warning_not_a_traceback(
    make_stack: MakeStack, caplog: pytest.LogCaptureFixture, watch_logs: Callable[[], None]
) -> None:
    stack = await make_stack()
    watch_logs()
    body = {"input": f"a b c {FAIL_MARKER}", "stream": True, "response_format": "pcm"}
    async with httpx.AsyncClient(base_url=stack.http_url) as http:
        async with http.stream("POST", "/v1/audio/speech", json=body) as r:
            assert r.status_code == 200
            with pytest.raises(httpx.RemoteProtocolError):  # truncated: never looks complete
                async for _ in r.aiter_bytes():
                    pass
    await asyncio.sleep(0.2)
    assert not _tracebacks(caplog), _tracebacks(caplog)
    cuts = [
        r for r in caplog.records if r.name == "voxstage.gateway.http_api" and "stream cut" in r.getMessage()
    ]
    assert len(cuts) == 1 and cuts[0].levelno == logging.WARNING
    await _still_serves(stack)
