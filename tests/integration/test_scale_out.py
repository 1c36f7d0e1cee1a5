"""Issue 17 on CPU: 2 talkers, 2 codecs and a gateway as real processes, found through names.

The gateway gets ``--talker talkers.test:P --codec codecs.test:Q``; each name resolves to two loopback
addresses (the replicas listen on 127.0.0.2 and 127.0.0.3, same port) through the test resolver seam
(``VOXSTAGE_TEST_RESOLVER_FILE``, read by the real resolver on every lookup, so the gateway's periodic and
on-failure re-resolution run as in production). The codecs allow ``talkers.test:P`` by name. Checked:
load spreads over the replicas (each stage's own metrics count what it served), a streaming call with
several segments stays on one talker and one codec, killing that talker ends it with UNAVAILABLE at once
while every request admitted after the kill succeeds, and a talker added to the name gets traffic within
seconds.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from tests.integration.stagekit import (
    MODEL,
    SEED_DEPLOY,
    StageProc,
    codec_status,
    reserve_ports,
    stage_env,
    start_stage,
)
from tests.integration.stagekit import talker_status as stage_talker_status
from tests.integration.test_stages import RELAXED_STALL
from voxstage.health_probe import check
from voxstage.resolver import TEST_RESOLVER_ENV
from voxstage.v1 import speech_pb2, speech_pb2_grpc

pytestmark = pytest.mark.timeout(120)

FRAMES = 16
SETS = [RELAXED_STALL, f"stages.0.default_sampling_params.max_tokens={FRAMES}"]
HOSTS = ("127.0.0.2", "127.0.0.3")
LATE = "127.0.0.4"  # a talker that joins the name later
PCM = speech_pb2.AUDIO_ENCODING_PCM_S16LE


@dataclass
class Fleet:
    talkers: dict[str, StageProc]  # by listen IP
    codecs: dict[str, StageProc]
    talker_metrics: dict[str, int]
    codec_metrics: dict[str, int]
    gateway: subprocess.Popen[bytes]
    gateway_addr: str
    hosts_file: Path
    talker_port: int
    codec_port: int

    def write_hosts(self, talkers: list[str]) -> None:
        tmp = self.hosts_file.with_suffix(".new")
        tmp.write_text(f"talkers.test {' '.join(talkers)}\ncodecs.test {' '.join(HOSTS)}\n")
        tmp.replace(self.hosts_file)  # atomic: a lookup never reads half a file


def served(host: str, port: int, name: str, label: str) -> float:
    body = urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=5).read().decode()
    return sum(
        float(line.split()[-1]) for line in body.splitlines() if line.startswith(name + "{") and label in line
    )


def talker_count(fleet: Fleet, ip: str) -> int:
    return int(served(ip, fleet.talker_metrics[ip], "voxstage_stage_requests_total", 'stage="talker"'))


def codec_count(fleet: Fleet, ip: str) -> int:
    seconds = served(ip, fleet.codec_metrics[ip], "voxstage_audio_generated_seconds_total", 'stage="codec"')
    return round(seconds / (FRAMES * 0.08))  # every request here is FRAMES frames of 80 ms


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    from voxstage.presets import resolve_model

    tmp = tmp_path_factory.mktemp("scale-out")
    cache = tmp / "cache"
    resolve_model(MODEL, cache=cache)
    hosts_file = tmp / "hosts"
    tp, cp, gp, hp, *metrics_ports = reserve_ports(9)
    env = pytest.MonkeyPatch()
    env.setenv(TEST_RESOLVER_ENV, str(hosts_file))  # stage_env() copies it into every process
    procs: list[StageProc] = []
    gateway: subprocess.Popen[bytes] | None = None
    try:
        talker_metrics = dict(zip((*HOSTS, LATE), metrics_ports[:3], strict=True))
        codec_metrics = dict(zip(HOSTS, metrics_ports[3:], strict=True))
        talkers = {
            ip: start_stage("talker", port=tp, listen=ip, cache=cache, logs=tmp, sets=SETS,
                            metrics_port=talker_metrics[ip], tag=ip)
            for ip in (*HOSTS, LATE)
        }  # fmt: skip
        codecs = {
            ip: start_stage("codec", port=cp, listen=ip, cache=cache, logs=tmp, sets=SETS,
                            metrics_port=codec_metrics[ip], tag=ip,
                            extra=["--allowed-talkers", f"talkers.test:{tp}"])
            for ip in HOSTS
        }  # fmt: skip
        procs = [*talkers.values(), *codecs.values()]
        gw_log = (tmp / "gateway.log").open("wb")
        cmd = [sys.executable, "-m", "voxstage", "gateway", "--config", str(SEED_DEPLOY)]
        cmd += ["--codec", f"codecs.test:{cp}", "--talker", f"talkers.test:{tp}", "--host", "127.0.0.1"]
        cmd += ["--grpc-port", str(gp), "--http-port", str(hp), "--set", "gateway.discovery_interval_s=0.5"]
        for item in SETS:
            cmd += ["--set", item]
        fleet = Fleet(talkers, codecs, talker_metrics, codec_metrics, None, f"127.0.0.1:{gp}",  # type: ignore[arg-type]
                      hosts_file, tp, cp)  # fmt: skip
        fleet.write_hosts(list(HOSTS))
        for proc in procs:
            proc.wait_serving(90)
        gateway = subprocess.Popen(cmd, env=stage_env(cache), stdout=gw_log, stderr=subprocess.STDOUT)
        fleet.gateway = gateway
        deadline = time.monotonic() + 60
        while not check(fleet.gateway_addr, timeout=1.0):
            assert gateway.poll() is None and time.monotonic() < deadline, (tmp / "gateway.log").read_text()
            time.sleep(0.2)
        yield fleet
    finally:
        env.undo()
        if gateway is not None and gateway.poll() is None:
            gateway.send_signal(signal.SIGTERM)
        for p in procs:
            if p.proc.poll() is None:
                p.proc.send_signal(signal.SIGTERM)
        if gateway is not None:
            try:
                gateway.wait(30)
            except subprocess.TimeoutExpired:
                gateway.kill()
        for p in procs:
            p.stop()


async def synthesize(stub: speech_pb2_grpc.SpeechStub, text: str) -> int:
    reply = await stub.Synthesize(
        speech_pb2.SynthesizeRequest(
            config=speech_pb2.SynthesisConfig(encoding=PCM, voice="ryan"), text=text
        ),
        timeout=60,
    )
    return len(reply.audio) // 2


@dataclass(frozen=True)
class Holder:
    """Which talker and which codec list a request in their own ``Status`` (independent of the gateway),
    and how many frames the talker has produced for it so far."""

    talkers: tuple[str, ...]
    codecs: tuple[str, ...]
    talker_frames: int


async def holder(fleet: Fleet, request_id: str) -> Holder:
    talkers, codecs, frames = [], [], 0
    for ip in HOSTS:
        if fleet.talkers[ip].proc.poll() is None:
            status = await stage_talker_status(f"{ip}:{fleet.talker_port}")
            mine = [r for r in status.requests if r.request_id == request_id]
            if mine:
                talkers.append(ip)
                frames = int(mine[0].frame_count)
        status = await codec_status(f"{ip}:{fleet.codec_port}")
        if any(r.request_id == request_id for r in status.requests):
            codecs.append(ip)
    return Holder(tuple(talkers), tuple(codecs), frames)


async def test_scale_out_through_names(fleet: Fleet) -> None:
    async with grpc.aio.insecure_channel(fleet.gateway_addr) as channel:
        stub = speech_pb2_grpc.SpeechStub(channel)

        # 1. Spread: 8 requests, 4 at a time. Least-loaded with round-robin ties: 4 each; allow 3-5.
        # (The counts start after each stage's own warm-up request.)
        base_t = {ip: talker_count(fleet, ip) for ip in HOSTS}
        base_c = {ip: codec_count(fleet, ip) for ip in HOSTS}
        for _ in range(2):
            sizes = await asyncio.gather(*(synthesize(stub, f"Spread request {i}.") for i in range(4)))
            assert sizes == [FRAMES * 1920] * 4
        per_talker = {ip: talker_count(fleet, ip) - base_t[ip] for ip in HOSTS}
        per_codec = {ip: codec_count(fleet, ip) - base_c[ip] for ip in HOSTS}
        assert sum(per_talker.values()) == 8 and sum(per_codec.values()) == 8, (per_talker, per_codec)
        assert all(3 <= n <= 5 for n in [*per_talker.values(), *per_codec.values()]), (per_talker, per_codec)

        # 2. Stickiness: one streaming call, two whole segments and the start of a third, on one talker and
        # one codec throughout. Each sample names the replicas whose Status lists the call's request id.
        call = stub.StreamingSynthesize(timeout=60)
        cfg = speech_pb2.SynthesisConfig(encoding=PCM, voice="ryan")
        await call.write(speech_pb2.StreamingSynthesizeRequest(config=cfg))
        request_id = ""
        seen: list[tuple[str, Holder]] = []  # (when, who held the call then)
        spoken = 0  # samples of the finished segments
        for segment in range(2):
            await call.write(speech_pb2.StreamingSynthesizeRequest(text=f"Segment {segment} of a long call."))
            await call.write(speech_pb2.StreamingSynthesizeRequest(flush=speech_pb2.Flush()))
            sampled = False
            while not (msg := await call.read()).HasField("segment_done"):
                assert msg is not grpc.aio.EOF
                if msg.HasField("started"):
                    request_id = msg.started.request_id
                if msg.HasField("audio") and not sampled:
                    assert msg.audio.segment_index == segment
                    seen.append((f"segment {segment} speaks", await holder(fleet, request_id)))
                    sampled = True
            assert msg.segment_done.segment_index == segment
            spoken += msg.segment_done.sample_count
            seen.append((f"after segment {segment}", await holder(fleet, request_id)))
        await call.write(speech_pb2.StreamingSynthesizeRequest(text="The third segment starts."))
        seen.append(("segment 2 starts", await holder(fleet, request_id)))
        pairs = {(h.talkers, h.codecs) for _, h in seen}
        assert len(pairs) == 1, seen
        ((talkers, codecs),) = pairs
        assert len(talkers) == 1 and len(codecs) == 1, seen
        # The one talker produced both segments' frames: it is the replica that served each of them.
        assert dict(seen)["after segment 1"].talker_frames * 1920 == spoken > 0, (spoken, seen)
        print("the streaming call's replicas:", *(f"{when}: {h}" for when, h in seen), sep="\n  ")
        serving = talkers[0]
        other = next(ip for ip in HOSTS if ip != serving)

        # 3. Kill that talker mid-call: the call ends with UNAVAILABLE at once, it does not move.
        fleet.talkers[serving].proc.send_signal(signal.SIGKILL)
        killed_at = time.monotonic()
        await call.write(speech_pb2.StreamingSynthesizeRequest(flush=speech_pb2.Flush()))
        with pytest.raises(grpc.aio.AioRpcError) as err:
            while (msg := await call.read()) is not grpc.aio.EOF:
                pass
            await call
        assert err.value.code() is grpc.StatusCode.UNAVAILABLE, err.value
        ended_in = time.monotonic() - killed_at
        print(f"the live call ended with UNAVAILABLE {ended_in:.2f} s after its talker was killed")
        assert ended_in < 2.0

        # Every request admitted after the kill succeeds, on the surviving talker.
        before = talker_count(fleet, other)
        sizes = await asyncio.gather(*(synthesize(stub, f"After the kill {i}.") for i in range(4)))
        assert sizes == [FRAMES * 1920] * 4
        assert talker_count(fleet, other) == before + 4

        # 4. A talker added to the name gets traffic within seconds (and the codecs allow it by name).
        late_base = talker_count(fleet, LATE)
        fleet.write_hosts([other, LATE])
        added_at = time.monotonic()
        while talker_count(fleet, LATE) == late_base:
            assert time.monotonic() - added_at < 10.0, "the new talker got no request"
            await asyncio.gather(*(synthesize(stub, f"New replica {i}.") for i in range(2)))
        print(f"the added talker served its first request {time.monotonic() - added_at:.1f} s after the name")
