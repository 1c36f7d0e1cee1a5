"""A ``voxstage serve`` stack on loopback ports, for benchmarks: start, wait until ready, stop."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from bench.procsample import stack_processes
from bench.prom import read_metrics
from voxstage import families
from voxstage.health_probe import check
from voxstage.placement import free_port

LOOPBACK = "127.0.0.1"
REPO = Path(__file__).resolve().parents[1]
DEPLOY = REPO / families.default_family().deploy_file
CHUNK_KEYS = "connectors.connector_of_shared_memory.extra"


def free_port_block(n: int, avoid: set[int], tries: int = 50) -> int:
    """A port P with P .. P+n-1 all free now and none in ``avoid`` (``voxstage serve`` gives replica k the
    metrics port P+k); the block joins ``avoid``."""
    for _ in range(tries):
        base = free_port(LOOPBACK, avoid)
        block = range(base, base + n)
        if base + n > 65536 or avoid.intersection(block):
            continue
        socks: list[socket.socket] = []
        try:
            for k in range(1, n):
                sock = socket.socket()
                socks.append(sock)
                sock.bind((LOOPBACK, base + k))
        except OSError:
            continue
        finally:
            for sock in socks:
                sock.close()
        avoid.update(block)
        return base
    raise RuntimeError(f"no block of {n} free loopback ports found")


@dataclass
class StackSpec:
    model: str
    device: str = "cuda"
    frames: int | None = 100  # fixed-length mode: EOS disabled for this many frames
    slots: int | None = None  # max_num_seqs of both stages (None: the deploy file's)
    max_model_len: int | None = None
    chunk_schedule: tuple[int, int] | None = None  # (initial, steady) frames for every request
    threads: int | None = None
    extra_sets: tuple[str, ...] = ()
    deploy: Path = DEPLOY
    # Talker + codec pairs on the one device: `pairs` replicas of each stage sharing it, `slots` split
    # evenly over them (the total stays `slots`) and each replica given `pair_memory_fraction` of the GPU.
    pairs: int = 1
    pair_memory_fraction: float | None = None  # None: 0.9 / (2 x pairs), so all replicas sum to 0.9
    # False when the pairs sit on GPUs of their own (bench/layouts.py places them by extra_sets): each
    # replica then keeps the deploy file's fraction, and only the slots are split.
    pairs_share_device: bool = True

    def replica_slots(self) -> int | None:
        return None if self.slots is None else max(1, self.slots // self.pairs)

    def sets(self) -> list[str]:
        out: list[str] = []
        if self.frames is not None:
            # The public API only caps frames (max_frames); the minimum is a deploy setting.
            out.append(f"stages.0.default_sampling_params.min_tokens={self.frames}")
        if self.pairs > 1:
            fraction = self.pair_memory_fraction or round(0.9 / (2 * self.pairs), 4)
            for stage in (0, 1):
                out += [f"stages.{stage}.replicas={self.pairs}"]
                if self.pairs_share_device:
                    out += [f"stages.{stage}.gpu_memory_utilization={fraction}"]
        if self.slots is not None:
            n = self.replica_slots()
            out += [f"stages.0.max_num_seqs={n}", f"stages.1.max_num_seqs={n}"]
        if self.max_model_len is not None:
            out.append(f"stages.0.max_model_len={self.max_model_len}")
        if self.chunk_schedule is not None:
            initial, steady = self.chunk_schedule
            out += [
                f"{CHUNK_KEYS}.initial_codec_chunk_frames={initial}",
                f"{CHUNK_KEYS}.codec_chunk_frames={steady}",
            ]
        return out + list(self.extra_sets)


class Stack:
    def __init__(self, spec: StackSpec, log: Path, env: dict[str, str] | None = None) -> None:
        self.spec = spec
        self.log = log
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        # Every port this stack is given is distinct: a probe's port is free again once its socket closes.
        taken: set[int] = set()
        self.grpc = f"{LOOPBACK}:{free_port_block(1, taken)}"
        self.http = f"{LOOPBACK}:{free_port_block(1, taken)}"
        # Replica k of a stage serves metrics on its stage's port + k.
        talker = free_port_block(spec.pairs, taken)
        self.metrics = {"talker": talker, "codec": free_port_block(spec.pairs, taken)}
        self.proc: subprocess.Popen[bytes] | None = None
        self.start_s: float | None = None

    def command(self) -> list[str]:
        s = self.spec
        cmd = [sys.executable, "-m", "voxstage", "serve", str(s.deploy), "--model", s.model]
        cmd += ["--device", s.device]
        cmd += ["--host", "127.0.0.1", "--grpc-port", self.grpc.rsplit(":", 1)[1]]
        cmd += ["--http-port", self.http.rsplit(":", 1)[1], "--start-timeout", "900", "--drain-grace", "10"]
        cmd += ["--talker-metrics-port", str(self.metrics["talker"])]
        cmd += ["--codec-metrics-port", str(self.metrics["codec"])]
        if s.threads is not None:
            cmd += ["--threads", str(s.threads)]
        for item in s.sets():
            cmd += ["--set", item]
        return cmd

    def start(self, timeout_s: float = 1200.0) -> bool:
        """Start; wait for SERVING on gRPC health and 200 on HTTP /health. False if it died or timed out."""
        t0 = time.monotonic()
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab") as out:
            out.write(f"$ {' '.join(self.command())}\n".encode())
            out.flush()
            self.proc = subprocess.Popen(
                self.command(), cwd=REPO, env=self.env, stdout=out, stderr=subprocess.STDOUT
            )
        while time.monotonic() - t0 < timeout_s:
            if self.proc.poll() is not None:
                return False
            if check(self.grpc, timeout=1.0) and self._http_ready():
                self.start_s = time.monotonic() - t0
                return True
            time.sleep(0.5)
        self.stop()
        return False

    def _http_ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://{self.http}/health", timeout=2.0) as r:
                return r.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def stop(self) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def stage_metrics_urls(self) -> dict[str, str]:
        """Each stage process's /metrics (``talker``, ``codec``; replicas ``talker-1``...)."""
        urls = {}
        for role, port in self.metrics.items():
            for k in range(self.spec.pairs):
                name = role if self.spec.pairs == 1 else f"{role}-{k}"
                urls[name] = f"http://127.0.0.1:{port + k}/metrics"
        return urls

    def scrape(self, prefix: Path) -> None:
        """Snapshot every process's Prometheus text to ``<prefix>_<process>.prom`` (counters are cumulative:
        diff two snapshots for a phase's tick times and counts)."""
        for name, url in {**self.stage_metrics_urls(), "gateway": f"http://{self.http}/metrics"}.items():
            Path(f"{prefix}_{name}.prom").write_text(read_metrics(url))

    def processes(self) -> dict[str, int]:
        """The pid of each stage process (``talker``, ``codec``, ``gateway``; replicas ``talker-1``...)."""
        return {} if self.proc is None else stack_processes(self.proc.pid)

    def process_groups(self) -> dict[str, list[int]]:
        """``processes()`` as ``bench.procsample.Sampler`` groups."""
        return {name: [pid] for name, pid in self.processes().items()}

    def tail(self, lines: int = 30) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
