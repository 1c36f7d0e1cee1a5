"""Run the deployment's own commands (docker-compose.yml, Dockerfile) as local processes.

Compose service names and container ports are rewritten to 127.0.0.1 and free ports, ``/models`` (and paths
under it) to a temp directory and ``${VAR:-default}`` to the variable's value where the caller sets one (as a
shell's environment would for ``docker compose up``), else its default; everything else is the command
exactly as the file has it.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from voxstage import placement

REPO = Path(__file__).resolve().parents[2]
PORT_FLAGS = ("--port", "--metrics-port", "--grpc-port", "--http-port")


_HANDED_OUT: set[int] = set()


def free_port() -> int:
    """A loopback port free now and not handed out before in this test process (a closed probe's port can be
    offered again before whoever it was given binds it)."""
    port = placement.free_port("127.0.0.1", _HANDED_OUT)
    _HANDED_OUT.add(port)
    return port


def expand(arg: str, values: dict[str, str] | None = None) -> str:
    values = values or {}
    return re.sub(r"\$\{(\w+):-([^}]*)\}", lambda m: values.get(m.group(1)) or m.group(2), arg)


@dataclass
class Proc:
    name: str
    proc: subprocess.Popen[bytes]
    log: Path
    health: list[str]

    def healthy(self) -> bool:
        return subprocess.run(self.health, cwd=REPO, capture_output=True, timeout=30).returncode == 0

    def wait_healthy(self, limit_s: float) -> None:
        deadline = time.monotonic() + limit_s
        while not self.healthy():
            if self.proc.poll() is not None:
                raise AssertionError(f"{self.name} exited {self.proc.returncode}:\n{self.tail()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.name} not healthy after {limit_s} s:\n{self.tail()}")
            time.sleep(1.0)

    def tail(self, lines: int = 30) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def stop(self, limit_s: float = 60.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(limit_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def start(name: str, command: list[str], health: list[str], env: dict[str, str], logs: Path) -> Proc:
    log = logs / f"{name}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(command, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
    return Proc(name, proc, log, health)


@dataclass
class ComposeStack:
    procs: dict[str, Proc]
    ports: dict[str, dict[str, int]]

    @property
    def grpc_addr(self) -> str:
        return f"127.0.0.1:{self.ports['gateway']['--grpc-port']}"

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.ports['gateway']['--http-port']}"

    def metrics_url(self, stage: str) -> str:
        if stage == "gateway":
            return f"{self.http_url}/metrics"
        return f"http://127.0.0.1:{self.ports[stage]['--metrics-port']}/metrics"

    def stop(self) -> dict[str, int]:
        # Compose stops dependents first: gateway, then codec, then talker.
        return {
            name: self.procs[name].stop() for name in ("gateway", "codec", "talker") if name in self.procs
        }


def start_compose_stack(
    tmp: Path, *, limit_s: float = 600.0, compose_env: dict[str, str] | None = None
) -> ComposeStack:
    """Start talker, codec and gateway in compose's order: each service once the services its ``depends_on``
    names pass their healthchecks (talker and codec together, then the gateway).
    ``compose_env`` is what ``VAR=value docker compose up`` would set (``VOXSTAGE_MODEL``, ...); the
    ``models`` volume is ``tmp/models``."""
    services = yaml.safe_load((REPO / "docker-compose.yml").read_text())["services"]
    models = tmp / "models"
    models.mkdir(exist_ok=True)

    # Other named volumes (the gateway's voice library) are folders under tmp too, wherever an argument
    # names their mount point (`--set gateway.voice_store_dir=/var/lib/voxstage/voices`).
    mounts = {}
    for svc in services.values():
        for volume in svc.get("volumes") or []:
            source, _, target = str(volume).partition(":")
            if source and not source.startswith((".", "/")) and source != "models":
                mounts[target.split(":")[0]] = tmp / source

    def local(arg: str) -> str:  # /models inside the containers is the volume: tmp/models here
        if arg == "/models" or arg.startswith("/models/"):
            return str(models) + arg[len("/models") :]
        for target, folder in mounts.items():
            arg = arg.replace(target, str(folder))
        return arg

    ports = {name: {flag: free_port() for flag in PORT_FLAGS} for name in ("talker", "codec", "gateway")}
    hosts = {}
    for name in ("talker", "codec"):
        command = services[name]["command"]
        hosts[f"{name}:{command[command.index('--port') + 1]}"] = f"127.0.0.1:{ports[name]['--port']}"
    stack = ComposeStack({}, ports)

    def needs(name: str) -> set[str]:
        return set(services[name].get("depends_on") or ())

    def start_service(name: str) -> None:
        svc = services[name]
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        env.update({k: local(expand(str(v), compose_env)) for k, v in svc["environment"].items()})
        command = [local(expand(a, compose_env)) for a in svc["command"]]
        for i, arg in enumerate(command[:-1]):
            if arg in PORT_FLAGS:
                command[i + 1] = str(ports[name][arg])
            elif arg in ("--codec", "--talker", "--allowed-talkers"):
                command[i + 1] = ",".join(hosts[a] for a in command[i + 1].split(","))
        assert command[0] == "python"
        command[0] = sys.executable  # `python` in the image is this venv's interpreter here
        port = ports[name]["--grpc-port" if name == "gateway" else "--port"]
        health = [
            re.sub(r"localhost:\d+", f"127.0.0.1:{port}", expand(a)) for a in svc["healthcheck"]["test"][1:]
        ]
        assert health[0] == "python"
        health[0] = sys.executable
        stack.procs[name] = start(name, command, health, env, tmp)

    try:
        healthy: set[str] = set()
        pending = ["talker", "codec", "gateway"]
        while pending:
            wave = [name for name in pending if needs(name) <= healthy]
            assert wave, f"depends_on of {pending} can never be met"
            for name in wave:
                start_service(name)
            for name in wave:
                stack.procs[name].wait_healthy(limit_s)
                healthy.add(name)
            pending = [name for name in pending if name not in wave]
    except BaseException:
        stack.stop()
        raise
    return stack


@dataclass(frozen=True)
class BaseImage:
    """The Dockerfile's ``FROM pytorch/pytorch:<torch>-cuda<cuda>-cudnn<n>-<flavour>``."""

    image: str
    torch: str
    cuda: str


def dockerfile_base() -> BaseImage:
    text = (REPO / "Dockerfile").read_text()
    match = re.search(r"^FROM (pytorch/pytorch:(\d+\.\d+\.\d+)-cuda(\d+\.\d+)-cudnn\d+-\w+)$", text, re.M)
    assert match is not None, "Dockerfile: FROM is not pytorch/pytorch:<torch>-cuda<x.y>-cudnn<n>-<flavour>"
    return BaseImage(*match.groups())


def dockerfile_cmd() -> list[str]:
    text = (REPO / "Dockerfile").read_text()
    match = re.search(r"^CMD (\[.*\])$", text, re.M)
    assert match is not None, "Dockerfile has no exec-form CMD"
    return list(json.loads(match.group(1)))
