"""Helpers for the stage integration tests: real ``voxstage talker|codec`` processes and a raw client.

The client speaks ``voxstage.internal.v1.Codec.Stream`` exactly as a gateway must (open with a sample window,
text, end_of_input, a credit back for every PCM chunk, half-close only after the terminal).
"""

from __future__ import annotations

import asyncio
import itertools
import os
import random
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import grpc
import numpy as np
from grpc_health.v1 import health_pb2, health_pb2_grpc

from voxstage.health_probe import check
from voxstage.internal.v1 import stage_pb2 as S
from voxstage.internal.v1 import stage_pb2_grpc
from voxstage.transport.host import verify_peer
from voxstage.transport.payload import ack_message, hello_from_proto, read_payload
from voxstage.transport.shm_reader import ShmReader

T = TypeVar("T")
ROOT = Path(__file__).resolve().parents[2]
SEED_DEPLOY = ROOT / "deploy" / "qwen3_tts.yaml"
MODEL = "qwen3-tts-tiny"
SPF = 1920
WINDOW_FRAMES = 51  # initial (1) + 2 x steady (25): the protocol's recommended window
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


@dataclass
class StageProc:
    role: str
    address: str  # where the test reaches it
    proc: subprocess.Popen[bytes]
    log: Path
    cmd: list[str] = field(default_factory=list)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def wait_serving(self, timeout: float = 90.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"{self.role} exited with {self.proc.returncode}:\n{self.tail()}")
            if check(self.address, timeout=1.0):
                return
            time.sleep(0.1)
        raise AssertionError(f"{self.role} not SERVING after {timeout} s:\n{self.tail()}")

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def reserve_ports(n: int) -> list[int]:
    """``n`` distinct ports that nothing on this machine holds now, on any address. They come from below the
    ephemeral range: ``bind(0)`` ports come from the range every process's outgoing connections use, and a
    port probed, closed and started on seconds later met one of those (or another process's test) often
    enough on this shared box to fail a multi-process test's start with "Address already in use"."""
    rng = random.Random(time.monotonic_ns() ^ os.getpid())
    held: list[socket.socket] = []
    try:
        while len(held) < n:
            s = socket.socket()
            try:
                s.bind(("0.0.0.0", rng.randrange(20000, 32000)))  # 0.0.0.0: taken on any address fails
            except OSError:
                s.close()
                continue
            held.append(s)
        return [int(s.getsockname()[1]) for s in held]
    finally:
        for s in held:
            s.close()


def stage_env(cache: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["VOXSTAGE_CACHE"] = str(cache)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def start_stage(
    role: str,
    *,
    port: int,
    cache: Path,
    logs: Path,
    listen: str | None = "127.0.0.1",
    reach: str | None = None,
    sets: Sequence[str] = (),
    metrics_port: int | None = None,
    netns: str | None = None,
    tag: str = "",
    model: str = MODEL,
    deploy: Path = SEED_DEPLOY,
    extra: Sequence[str] = (),
    own_shm: bool = False,
) -> StageProc:
    """Start ``voxstage <role>`` on a seed deploy file with a tiny preset (one torch thread); ``listen``
    None leaves ``--host`` at the stage's default (loopback), ``extra`` are more flags. ``own_shm`` (with
    ``netns``) gives the process a ``/dev/shm`` of its own, as another host has: the namespace shares
    this machine's boot id, so only that makes the shared-memory probe fail as it does across hosts."""
    cmd = [sys.executable, "-m", "voxstage", role, "--config", str(deploy), "--model", model]
    cmd += ["--host", listen] if listen is not None else []
    cmd += ["--port", str(port), "--device", "cpu", "--threads", "1", "--drain-grace", "20", *extra]
    if metrics_port is not None:
        cmd += ["--metrics-port", str(metrics_port)]
    for item in sets:
        cmd += ["--set", item]
    if netns is not None and own_shm:
        # `ip netns exec` runs the command in a mount namespace of its own (slave): this mount stays there.
        mount = 'mount -t tmpfs -o size=256m voxstage-host /dev/shm && exec "$@"'
        cmd = ["ip", "netns", "exec", netns, "sh", "-c", mount, "sh", *cmd]  # sh execs: the pid is python's
    elif netns is not None:
        cmd = ["ip", "netns", "exec", netns, *cmd]  # execs the command: the Popen pid is python's
    log = logs / f"{role}{tag}-{time.monotonic_ns()}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, env=stage_env(cache), stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
    return StageProc(role, f"{reach or listen or '127.0.0.1'}:{port}", proc, log, cmd)


def metric(port: int, name: str, labels: str = "") -> float:
    """One sample of a stage's /metrics (0 when the series has not been created yet)."""
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    key = f"{name}{{{labels}}}" if labels else name
    for line in body.splitlines():
        if line.startswith(key + " "):
            return float(line.split()[-1])
    return 0.0


@dataclass(frozen=True)
class Reference:
    """A voice-clone clip as a gateway forwards it: float PCM, its rate, and (for ICL) its transcript."""

    pcm: np.ndarray
    sample_rate: int
    text: str = ""


def reference_clip(seconds: float = 2.0, rate: int = 16000, text: str = "") -> Reference:
    """A deterministic voiced-ish clip (harmonics plus a little noise) at a rate the codec must resample."""
    t = np.arange(int(seconds * rate)) / rate
    pcm = sum(0.2 / k * np.sin(2 * np.pi * 140 * k * t) for k in range(1, 6))
    pcm = pcm + 0.01 * np.random.default_rng(0).standard_normal(t.size)
    return Reference(pcm.astype(np.float32), rate, text)


@dataclass
class Result:
    opened: S.StreamOpened | None = None
    chunks: list[S.PcmChunk] = field(default_factory=list)
    pcm: list[np.ndarray] = field(default_factory=list)
    segment_done: S.SegmentDone | None = None
    eos: S.EndOfStream | None = None
    t_first: float | None = None
    t_end: float | None = None

    @property
    def audio(self) -> np.ndarray:
        return np.concatenate(self.pcm) if self.pcm else np.zeros(0, np.float32)


OnPcm = Callable[[Result, grpc.aio.StreamStreamCall], Awaitable[bool]]


async def synthesize(
    codec: str,
    talker: str,
    text: str,
    *,
    voice: str = "ryan",
    seed: int | None = 42,
    max_frames: int | None = None,
    reference: Reference | None = None,
    stream_text: Sequence[str] = (),
    fmt: int = S.PCM_FORMAT_F32LE,
    on_pcm: OnPcm | None = None,
    deadline_s: float = 60.0,
    shm: ShmReader | None = None,
    in_open: bool = False,
    deltas: bool = False,
) -> Result:
    """One request through ``Codec.Stream``. ``on_pcm`` runs after each chunk; returning False stops reading
    (the caller has cancelled or is about to kill something). With ``shm`` the client verifies the codec's
    probe at ``open`` (§9), so the codec may lend it chunks in shared memory: each is read and acked. With
    ``in_open`` the text (and, without ``stream_text``, the end of input) ride in the open (§2); ``deltas``
    marks the text as deltas (``text_deltas``) without streaming more of it."""
    verified = ""
    if shm is not None:
        verified = verify_peer(hello_from_proto((await codec_status(codec, requests=False)).transport))
    async with grpc.aio.insecure_channel(codec) as channel:
        stub = stage_pb2_grpc.CodecStub(channel)
        outbox: asyncio.Queue[S.CodecStreamRequest | None] = asyncio.Queue()

        async def requests():  # type: ignore[no-untyped-def]
            while (msg := await outbox.get()) is not None:
                yield msg

        call = stub.Stream(requests(), timeout=deadline_s)
        op = S.StreamOpen(
            request_id=f"it-{time.monotonic_ns()}",
            mode=S.STREAM_MODE_TTS,
            talker_address=talker,
            voice=voice,
            pcm_format=fmt,
            initial_credit=S.Credit(unit=S.CREDIT_UNIT_SAMPLES, amount=WINDOW_FRAMES * SPF),
        )
        if verified:
            op.transport.verified_peer_probe = verified
        if seed is not None:
            op.seed = seed
        if max_frames is not None:
            op.sampling.max_frames = max_frames
        if reference is not None:
            ref = op.reference
            ref.audio.inline = np.ascontiguousarray(reference.pcm, dtype="<f4").tobytes()
            ref.audio_format = S.PCM_FORMAT_F32LE
            ref.audio_sample_rate_hz = reference.sample_rate
            ref.text = reference.text
        if stream_text or deltas:
            # Streaming input: deltas, so the talker starts the segment early (early_start_chars) in its
            # streaming-text mode and takes the rest as it comes.
            op.text_deltas = True
        if in_open:
            op.initial_text, op.initial_end_of_input = text, not stream_text
        outbox.put_nowait(S.CodecStreamRequest(open=op))
        if not in_open:
            outbox.put_nowait(S.CodecStreamRequest(text=text))
        for delta in stream_text:
            outbox.put_nowait(S.CodecStreamRequest(text=delta))
        if not op.initial_end_of_input:
            outbox.put_nowait(S.CodecStreamRequest(end_of_input=S.EndOfInput()))
        res = Result()
        t0 = time.monotonic()
        try:
            async for resp in call:
                kind = resp.WhichOneof("response")
                if kind == "opened":
                    res.opened = resp.opened
                elif kind == "pcm":
                    res.t_first = res.t_first or time.monotonic() - t0
                    res.chunks.append(resp.pcm)
                    dtype = "<f4" if resp.pcm.format == S.PCM_FORMAT_F32LE else "<i2"
                    data, ref = read_payload(resp.pcm.data, shm if verified else None)
                    if ref is not None:
                        outbox.put_nowait(S.CodecStreamRequest(shm_ack=ack_message([ref])))
                    res.pcm.append(np.frombuffer(data, dtype=dtype).astype(np.float32))
                    credit = S.Credit(unit=S.CREDIT_UNIT_SAMPLES, amount=resp.pcm.sample_count)
                    outbox.put_nowait(S.CodecStreamRequest(credit=credit))
                    if on_pcm is not None and not await on_pcm(res, call):
                        return res
                elif kind == "segment_done":
                    res.segment_done = resp.segment_done
                elif kind == "end_of_stream":
                    res.eos = resp.end_of_stream
                    res.t_end = time.monotonic() - t0
                    break
        finally:
            outbox.put_nowait(None)  # half-close only now: credits must flow until the terminal
        return res


async def talker_status(address: str, requests: bool = True) -> S.StageStatus:
    async with grpc.aio.insecure_channel(address) as channel:
        reply = await stage_pb2_grpc.TalkerStub(channel).Status(
            S.TalkerStatusRequest(include_requests=requests), timeout=5
        )
        return reply.status


async def codec_status(address: str, requests: bool = True) -> S.StageStatus:
    async with grpc.aio.insecure_channel(address) as channel:
        reply = await stage_pb2_grpc.CodecStub(channel).Status(
            S.CodecStatusRequest(include_requests=requests), timeout=5
        )
        return reply.status


def shm_files(pid: int) -> list[str]:
    return sorted(p.name for p in Path("/dev/shm").glob(f"voxstage-{pid}-*"))


async def health(address: str) -> int | None:
    """The server's overall health status, or None when it cannot be reached."""
    async with grpc.aio.insecure_channel(address) as channel:
        try:
            reply = await health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=2
            )
        except grpc.aio.AioRpcError:
            return None
        return int(reply.status)


async def eventually(
    probe: Callable[[], Awaitable[T | None]], within: float, interval: float = 0.02
) -> T | None:
    """Poll ``probe`` until it returns something other than None, or ``within`` seconds pass (then None)."""
    deadline = time.monotonic() + within
    for _ in itertools.count():
        value = await probe()
        if value is not None or time.monotonic() >= deadline:
            return value
        await asyncio.sleep(interval)
    return None


def open_msg(talker: str, **fields: object) -> S.StreamOpen:
    """A valid ``StreamOpen`` for the tiny preset; ``fields`` override or add to it."""
    op = S.StreamOpen(
        request_id=f"it-{time.monotonic_ns()}",
        mode=S.STREAM_MODE_TTS,
        talker_address=talker,
        voice="ryan",
        pcm_format=S.PCM_FORMAT_F32LE,
        initial_credit=S.Credit(unit=S.CREDIT_UNIT_SAMPLES, amount=WINDOW_FRAMES * SPF),
    )
    for name, value in fields.items():
        if isinstance(value, S.Credit):
            getattr(op, name).CopyFrom(value)
        else:
            setattr(op, name, value)
    return op


async def exchange(codec: str, messages: Sequence[S.CodecStreamRequest]) -> list[S.CodecStreamResponse]:
    """Send ``messages``, then read until the terminal (granting no credit) and half-close."""
    async with grpc.aio.insecure_channel(codec) as channel:
        outbox: asyncio.Queue[S.CodecStreamRequest | None] = asyncio.Queue()
        for msg in messages:
            outbox.put_nowait(msg)

        async def requests():  # type: ignore[no-untyped-def]
            while (msg := await outbox.get()) is not None:
                yield msg

        call = stage_pb2_grpc.CodecStub(channel).Stream(requests(), timeout=30)
        out: list[S.CodecStreamResponse] = []
        async for resp in call:
            out.append(resp)
            if resp.HasField("end_of_stream"):
                break
        outbox.put_nowait(None)
        return out
