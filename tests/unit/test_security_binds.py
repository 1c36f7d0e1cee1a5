"""Issue 15: stages listen on loopback unless told otherwise; compose opens them (and only them) to its own
network, and publishes Prometheus/Grafana on the host's loopback with no anonymous Grafana admin."""

from __future__ import annotations

import re
import socket
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.integration.stagekit import start_stage
from voxstage.launch.cli import build_parser
from voxstage.stage.process import DEFAULT_HOST

REPO = Path(__file__).resolve().parents[2]


def compose() -> dict[str, Any]:
    return yaml.safe_load((REPO / "docker-compose.yml").read_text())


@pytest.mark.parametrize("role", ["talker", "codec"])
def test_a_stage_listens_on_loopback_unless_host_is_given(role: str) -> None:
    parser = build_parser()
    assert DEFAULT_HOST == "127.0.0.1"
    assert parser.parse_args([role, "--config", "x.yaml"]).host == "127.0.0.1"
    assert parser.parse_args([role, "--config", "x.yaml", "--host", "0.0.0.0"]).host == "0.0.0.0"


def test_compose_opens_the_stages_to_its_network_and_pins_the_codec_to_its_talker() -> None:
    services = compose()["services"]
    for name in ("talker", "codec"):
        command = services[name]["command"]
        assert command[command.index("--host") + 1] == "0.0.0.0"  # the gateway container dials them
        assert "ports" not in services[name]  # never published on the host
    talker, codec = services["talker"]["command"], services["codec"]["command"]
    gateway = services["gateway"]["command"]
    talker_address = f"talker:{talker[talker.index('--port') + 1]}"
    assert codec[codec.index("--allowed-talkers") + 1] == talker_address
    assert gateway[gateway.index("--talker") + 1] == talker_address  # what the gateway puts in `open`


def test_compose_keeps_prometheus_and_grafana_on_loopback_and_grafana_not_anonymous() -> None:
    services = compose()["services"]
    for name in ("prometheus", "grafana"):
        for port in services[name]["ports"]:
            assert str(port).startswith("127.0.0.1:"), f"{name} publishes {port} on every interface"
    env = services["grafana"]["environment"]
    # Anonymous visitors may only look: never the admin role (Grafana's anonymous role defaults to Viewer).
    anonymous = str(env["GF_AUTH_ANONYMOUS_ENABLED"]).lower() == "true"
    assert not anonymous or env.get("GF_AUTH_ANONYMOUS_ORG_ROLE", "Viewer") == "Viewer"
    assert str(env["GF_USERS_ALLOW_SIGN_UP"]).lower() == "false"
    assert re.fullmatch(r"\$\{GRAFANA_ADMIN_PASSWORD[:?-][^}]*\}", env["GF_SECURITY_ADMIN_PASSWORD"])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _listening(port: int) -> set[str]:
    """Local addresses (hex, as /proc/net/tcp* writes them) of the sockets listening on ``port``."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            addr, hexport = local.split(":")
            if state == "0A" and int(hexport, 16) == port:
                found.add(addr)
    return found


def _non_loopback_address() -> str | None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.255", 9))  # no packet is sent: this only picks the outgoing interface
        except OSError:
            return None
        addr = s.getsockname()[0]
    return None if addr.startswith("127.") else addr


LOOPBACK_HEX = {"0100007F", "0000000000000000FFFF00000100007F"}  # 127.0.0.1, ::ffff:127.0.0.1


def test_a_codec_started_without_host_listens_on_loopback_only(tmp_path: Path) -> None:
    port, metrics = _free_port(), _free_port()
    codec = start_stage(
        "codec", port=port, cache=tmp_path / "cache", logs=tmp_path, listen=None, metrics_port=metrics
    )  # no --host: the default
    try:
        codec.wait_serving(120)
        assert f"SERVING on 127.0.0.1:{port}" in codec.log.read_text()
        for p in (port, metrics):
            bound = _listening(p)
            assert bound and bound <= LOOPBACK_HEX, (p, bound)
        other = _non_loopback_address()
        if other is not None:
            for p in (port, metrics):
                with socket.socket() as s, pytest.raises(OSError):
                    s.settimeout(2.0)
                    s.connect((other, p))
    finally:
        codec.stop()
