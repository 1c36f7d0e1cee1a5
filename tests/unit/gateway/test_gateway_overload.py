"""Overload at 3x admission against a real ``voxstage gateway`` process (stage doubles in this process).

Rejected requests get RESOURCE_EXHAUSTED / HTTP 429 with a retry hint at once; admitted ones complete with
all their audio at the pace they have alone; the gateway's memory stays flat across rounds; and the
time-to-first-audio histogram counts every admitted stream.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import socket
import sys
import time
from pathlib import Path

import grpc
import httpx
from gateway_fakes import FakeCodec, expected_samples, start_codec, start_talker
from gateway_kit import SEED

from voxstage.client import AsyncSpeechClient, RetryPolicy, SpeechError
from voxstage.health_probe import check

LIMIT = 4
TEXT = "x" * 30  # 30 frames at 20 ms each: about 0.6 s per request


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rss_kib(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    match = re.search(r"VmRSS:\s+(\d+) kB", status)
    assert match is not None
    return int(match.group(1))


def metric(text: str, name: str, labels: str) -> float:
    match = re.search(rf"^{re.escape(name)}\{{{re.escape(labels)}\}} (\S+)$", text, re.M)
    return float(match.group(1)) if match else 0.0


async def grpc_stream(client: AsyncSpeechClient) -> tuple[str, int, float]:
    start = time.monotonic()
    samples = 0
    try:
        async for chunk in client.stream(TEXT, encoding="pcm"):
            samples += len(chunk.data) // 2
    except SpeechError as exc:
        if exc.code is not grpc.StatusCode.RESOURCE_EXHAUSTED:
            return f"{exc.code.name}: {exc.message}", samples, time.monotonic() - start
        return f"{exc.code.name}{'+hint' if exc.retry_after_s else ''}", samples, time.monotonic() - start
    return "OK", samples, time.monotonic() - start


async def http_speech(http: httpx.AsyncClient) -> tuple[str, int, float]:
    start = time.monotonic()
    r = await http.post("/v1/audio/speech", json={"input": TEXT, "response_format": "pcm", "stream": True})
    if r.status_code != 200:
        hint = "+hint" if int(r.headers.get("retry-after", "0")) >= 1 else ""
        return f"{r.status_code}{hint}", 0, time.monotonic() - start
    return "OK", len(r.content) // 2, time.monotonic() - start


async def test_overload_at_three_times_admission(cache: Path) -> None:
    codec = await start_codec(FakeCodec(frame_delay_s=0.02))
    talker = await start_talker()
    grpc_port, http_port = free_port(), free_port()
    cmd = [
        sys.executable, "-m", "voxstage", "gateway", "--config", str(SEED), "--platform", "cpu",
        "--codec", codec.address, "--talker", talker.address,
        "--grpc-port", str(grpc_port), "--http-port", str(http_port), "--host", "127.0.0.1",
        "--set", f"gateway.max_concurrent_requests={LIMIT}", "--set", "gateway.max_queue=0",
        "--log-level", "warning",
    ]  # fmt: skip
    proc = await asyncio.create_subprocess_exec(*cmd, env={**os.environ, "VOXSTAGE_CACHE": str(cache)})
    # No SDK retries: this test wants to see every refusal.
    client = AsyncSpeechClient(f"127.0.0.1:{grpc_port}", retry=RetryPolicy(max_attempts=1))
    try:
        deadline = time.monotonic() + 30
        while not await asyncio.to_thread(check, f"127.0.0.1:{grpc_port}", "", 1.0):
            assert proc.returncode is None and time.monotonic() < deadline, "gateway did not become SERVING"
            await asyncio.sleep(0.1)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{http_port}", timeout=30) as http:
            for _ in range(2):  # warm-up: first-use allocations are not growth
                await asyncio.gather(grpc_stream(client), http_speech(http))
            _, _, alone = await grpc_stream(client)
            before = (await http.get("/metrics")).text
            rss: list[int] = []
            admitted_grpc = 0
            for _ in range(5):
                results = await asyncio.gather(
                    *(grpc_stream(client) for _ in range(3 * LIMIT // 2)),
                    *(http_speech(http) for _ in range(3 * LIMIT // 2)),
                )
                ok = [r for r in results if r[0] == "OK"]
                refused = [r[0] for r in results if r[0] != "OK"]
                assert LIMIT <= len(ok) < 3 * LIMIT, results
                assert set(refused) <= {"RESOURCE_EXHAUSTED+hint", "429+hint"}, refused
                assert all(samples == expected_samples(TEXT) for _, samples, _ in ok)
                # Admitted streams keep their pace: refusals cost them nothing.
                assert max(seconds for _, _, seconds in ok) < 1.5 * alone + 0.3, (alone, ok)
                admitted_grpc += sum(1 for r in results[: 3 * LIMIT // 2] if r[0] == "OK")
                rss.append(rss_kib(proc.pid))
            after = (await http.get("/metrics")).text
        assert rss[-1] - rss[0] < 8 * 1024, f"gateway RSS grew {rss} KiB"
        ttfa = "voxstage_time_to_first_audio_seconds_count"
        moved = metric(after, ttfa, 'api="grpc_streaming"') - metric(before, ttfa, 'api="grpc_streaming"')
        assert moved == admitted_grpc
        rejected = metric(after, "voxstage_requests_total", 'outcome="rejected"')
        assert rejected - metric(before, "voxstage_requests_total", 'outcome="rejected"') >= 5 * LIMIT
        # What admission bounds: the streams the gateway has open and unanswered at the codec at once (a
        # stream it has ended may still await its half-close there for a few loop steps).
        assert codec.servicer.max_working <= LIMIT
        assert codec.servicer.working == 0
    finally:
        await client.close()
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 30) == 0
        await codec.server.stop(0)
        await talker.server.stop(0)
