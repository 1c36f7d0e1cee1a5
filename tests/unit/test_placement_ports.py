"""``voxstage serve``'s free ports (voxstage.placement): a stage never gets a port that the launcher hands to
someone else, though a probe's port is free again once its socket closes (CI once gave the codec the port the
gateway's HTTP face was about to bind)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from voxstage import placement
from voxstage.config import load_deploy_config

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "qwen3_tts.yaml"


class RepeatingKernel:
    """A socket whose ephemeral port comes from a fixed sequence, the way the kernel may offer a just-closed
    port again."""

    ports: list[int] = []

    def __init__(self, *args: object) -> None:
        pass

    def __enter__(self) -> RepeatingKernel:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def bind(self, address: tuple[str, int]) -> None:
        pass

    def getsockname(self) -> tuple[str, int]:
        return "127.0.0.1", RepeatingKernel.ports.pop(0)


def test_a_free_port_avoids_the_ports_it_is_told(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(placement.socket, "socket", RepeatingKernel)
    RepeatingKernel.ports = [5000, 5000, 5001]
    assert placement.free_port("127.0.0.1", avoid={5000}) == 5001
    RepeatingKernel.ports = [5000] * 100
    with pytest.raises(RuntimeError, match="no free port"):
        placement.free_port("127.0.0.1", avoid={5000})


def test_stage_ports_avoid_the_gateways_the_metrics_and_each_other(monkeypatch: pytest.MonkeyPatch) -> None:
    config = load_deploy_config(DEPLOY, platform="cpu")
    monkeypatch.setattr(placement.socket, "socket", RepeatingKernel)
    # The kernel offers the gateway's HTTP port, a metrics port, the talker's own port again, then fresh ones.
    RepeatingKernel.ports = [8080, 9100, 7001, 7001, 9200, 7002]
    talkers, codecs = placement.place(
        config, "127.0.0.1", talker_metrics_port=9100, codec_metrics_port=9200, reserved=(50051, 8080)
    )
    assert [t.port for t in talkers] == [7001] and [c.port for c in codecs] == [7002]


def test_real_free_ports_are_bindable_and_distinct() -> None:
    config = load_deploy_config(DEPLOY, platform="cpu")
    talkers, codecs = placement.place(config, "127.0.0.1", reserved=(50051, 8000))
    ports = [p.port for p in (*talkers, *codecs)]
    assert len(set(ports)) == len(ports) and not {50051, 8000} & set(ports)
    for port in ports:
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))
