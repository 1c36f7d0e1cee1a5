"""Where ``voxstage serve`` puts each stage process: replicas, ports, GPUs.

A stage's ``replicas`` / ``replica_devices`` (config/stage.py) say how many processes of it run on this
host and which GPUs each sees. Every replica is an ordinary stage process with its own port (an explicit
``--talker-port P`` gives replica k port P+k; otherwise free ports) and its own supervision; the codecs
may dial every talker replica, and the gateway gets every address. One replica per stage, the seed
files' shape, keeps the names and ports it always had.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Collection
from dataclasses import dataclass

from voxstage.config import DeployConfig
from voxstage.config.stage import StageConfig


@dataclass(frozen=True)
class Placement:
    role: str  # talker | codec: the ``voxstage`` subcommand
    name: str  # talker, or talker-0, talker-1, ... when the stage has several replicas
    host: str
    port: int
    metrics_port: int | None
    visible: str  # CUDA_VISIBLE_DEVICES of the process

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


def free_port(host: str, avoid: Collection[int] = ()) -> int:
    """A port free on ``host`` now and not in ``avoid`` (ports the launcher hands out or binds later: the
    kernel may offer them again, since a probe's socket is closed before anyone binds its port)."""
    for _ in range(100):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((host, 0))
            port = int(s.getsockname()[1])
        if port not in avoid:
            return port
    raise RuntimeError(f"no free port on {host} outside {sorted(avoid)[:10]}")


def visible_devices(devices: str) -> str:
    """The stage's ``devices`` are indices into the launcher's own visible list."""
    parent = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = [int(i) for i in devices.split(",")]
    if parent is None or not parent.strip():
        return ",".join(str(i) for i in ids)
    entries = [e.strip() for e in parent.split(",") if e.strip()]
    missing = [i for i in ids if i >= len(entries)]
    if missing:
        raise ValueError(f"devices {devices!r} index past CUDA_VISIBLE_DEVICES={parent!r}")
    return ",".join(entries[i] for i in ids)


def place_stage(
    role: str,
    stage: StageConfig,
    host: str,
    port: int,
    metrics_port: int | None,
    avoid: set[int],
) -> list[Placement]:
    """One placement per replica; ``port`` 0 picks free ports outside ``avoid`` (and adds them to it). Raises
    ValueError for a device index past the launcher's CUDA_VISIBLE_DEVICES."""
    lists = stage.replica_device_lists
    out = []
    for k, devices in enumerate(lists):
        picked = port + k if port else free_port(host, avoid)
        avoid.add(picked)
        out.append(
            Placement(
                role=role,
                name=role if len(lists) == 1 else f"{role}-{k}",
                host=host,
                port=picked,
                metrics_port=None if metrics_port is None else metrics_port + k,
                visible=visible_devices(devices),
            )
        )
    return out


def place(
    config: DeployConfig,
    host: str,
    *,
    talker_port: int = 0,
    codec_port: int = 0,
    talker_metrics_port: int | None = None,
    codec_metrics_port: int | None = None,
    reserved: Collection[int] = (),
) -> tuple[list[Placement], list[Placement]]:
    """The talker replicas and the codec replicas of this host. ``reserved``: ports bound by others the
    launcher starts (the gateway's); a picked port avoids them, the metrics ports and every port picked
    before."""
    avoid = {*reserved}
    for first, stage in (
        (talker_metrics_port, config.talker),
        (codec_metrics_port, config.codec),
        (talker_port, config.talker),
        (codec_port, config.codec),
    ):
        if first:  # each replica k takes first + k
            avoid.update(first + k for k in range(len(stage.replica_device_lists)))
    talkers = place_stage("talker", config.talker, host, talker_port, talker_metrics_port, avoid)
    codecs = place_stage("codec", config.codec, host, codec_port, codec_metrics_port, avoid)
    taken = [p.port for p in (*talkers, *codecs)]
    if len(set(taken)) != len(taken):
        raise ValueError(f"the replicas' ports overlap ({sorted(taken)}): move --talker-port or --codec-port")
    return talkers, codecs
