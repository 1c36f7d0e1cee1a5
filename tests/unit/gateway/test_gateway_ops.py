"""Static checks of the deployment files: docker-compose.yml, Dockerfile, Prometheus and Grafana config.

The compose file is validated against the Compose Specification schema as shipped by docker-compose 1.29
(``data/compose_spec.json``, Apache-2.0, copied from ``compose/config/compose_spec.json``) and, where the
``docker-compose`` tool is installed, by ``docker-compose config``. The commands these files run are
started as real processes in tests/integration/test_gateway_deploy.py.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from voxstage import metrics
from voxstage.launch.cli import build_parser

REPO = Path(__file__).resolve().parents[3]
COMPOSE = REPO / "docker-compose.yml"
STAGES = ("talker", "codec", "gateway")


def compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text())


def expand(arg: str) -> str:
    """Compose's ``${VAR:-default}`` with the default (the variables are unset in CI)."""
    return re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", arg)


def test_compose_validates_against_the_compose_spec() -> None:
    schema = json.loads((Path(__file__).parent / "data" / "compose_spec.json").read_text())
    validator = jsonschema.Draft201909Validator(schema, format_checker=jsonschema.FormatChecker())
    errors = [f"{'/'.join(map(str, e.path))}: {e.message}" for e in validator.iter_errors(compose())]
    assert not errors, errors
    broken = compose()
    broken["services"]["talker"]["healthcheck"]["retries"] = "three"
    assert list(validator.iter_errors(broken)), "the schema must catch a wrong type"


def test_docker_compose_config_accepts_the_file() -> None:
    tool = shutil.which("docker-compose")
    if tool is None:
        pytest.skip("docker-compose is not installed (apt-get install docker-compose)")
    run = subprocess.run([tool, "-f", str(COMPOSE), "config", "--quiet"], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr


def test_compose_shape() -> None:
    doc = compose()
    assert "version" not in doc  # obsolete in the Compose Specification
    services = doc["services"]
    assert set(services) == {*STAGES, "prometheus", "grafana"}
    for name in ("talker", "codec"):
        svc = services[name]
        (device,) = svc["deploy"]["resources"]["reservations"]["devices"]
        assert device["driver"] == "nvidia" and device["capabilities"] == ["gpu"]
        assert len(device["device_ids"]) == 1 and "count" not in device  # one pinned GPU per stage
    assert services["talker"]["ipc"] == "shareable"
    assert services["codec"]["ipc"] == services["gateway"]["ipc"] == "service:talker"
    for name in STAGES:
        svc = services[name]
        check = svc["healthcheck"]["test"]
        assert check[:4] == ["CMD", "python", "-m", "voxstage.health_probe"]
        port = svc["command"][svc["command"].index("--grpc-port" if name == "gateway" else "--port") + 1]
        assert check[-1] == f"localhost:{port}"
        # The stages load checkpoints; the gateway learns the model from the talker's Status and mounts none.
        mounts_models = any(str(v).startswith("models:/models") for v in svc["volumes"])
        assert mounts_models == (name != "gateway"), name
    assert services["gateway"]["depends_on"] == {
        "talker": {"condition": "service_healthy"},
        "codec": {"condition": "service_healthy"},
    }
    # The stages load together: a codec dials a talker only when a stream names it (as `voxstage serve`).
    assert "depends_on" not in services["codec"] and "depends_on" not in services["talker"]
    assert "models" in doc["volumes"]


def test_compose_commands_parse_with_the_cli() -> None:
    parser = build_parser()
    for name in STAGES:
        command = [expand(a) for a in compose()["services"][name]["command"]]
        assert command[:3] == ["python", "-m", "voxstage"]
        args = parser.parse_args(command[3:])
        assert args.command == name
        assert Path(REPO / args.config).is_file()
    gateway = parser.parse_args([expand(a) for a in compose()["services"]["gateway"]["command"]][3:])
    assert gateway.codec == "codec:50062" and gateway.talker == "talker:50061"


def test_dockerfile() -> None:
    text = (REPO / "Dockerfile").read_text()
    base = re.search(r"^FROM (\S+)", text, re.M)
    assert base is not None and "cuda" in base.group(1) and base.group(1).startswith("pytorch/pytorch:")
    assert "pip install ." in text and "[dev]" not in text  # product dependencies only
    cmd = json.loads(re.search(r"^CMD (\[.*\])$", text, re.M).group(1))  # type: ignore[union-attr]
    args = build_parser().parse_args(cmd[3:])
    assert cmd[:3] == ["python", "-m", "voxstage"] and args.command == "serve"
    for source in re.findall(r"^COPY (.+) \S+$", text, re.M):
        for path in shlex.split(source):
            assert list(REPO.glob(path)) or "[" in path, f"COPY {path}: missing"
    ignored = (REPO / ".dockerignore").read_text().split()
    assert {".venv", ".git", "tests"} <= set(ignored)


def test_prometheus_scrapes_every_process() -> None:
    config = yaml.safe_load((REPO / "deploy" / "prometheus.yml").read_text())
    targets = {t for job in config["scrape_configs"] for sc in job["static_configs"] for t in sc["targets"]}
    services = compose()["services"]
    expected = {"gateway:8000"}
    for name in ("talker", "codec"):
        command = services[name]["command"]
        expected.add(f"{name}:{command[command.index('--metrics-port') + 1]}")
    assert targets == expected
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed")
    run = subprocess.run([promtool, "check", "config", str(REPO / "deploy" / "prometheus.yml")],
                         capture_output=True, text=True)  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr


def test_grafana_dashboard_uses_contract_metrics_and_valid_promql(tmp_path: Path) -> None:
    dash = json.loads((REPO / "deploy" / "grafana" / "dashboards" / "voxstage.json").read_text())
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables["DS_PROMETHEUS"]["type"] == "datasource"
    assert {"api", "stage"} <= set(variables)
    titles = " ".join(p["title"] for p in dash["panels"]).lower()
    for needed in ("first audio", "real-time factor", "underrun", "tick", "slots", "queue depth"):
        assert needed in titles
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}
    exported = {m.name + sfx for m in metrics.REGISTRY.collect() for sfx in suffixes[m.type]}
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    for panel in dash["panels"]:
        assert panel["datasource"]["uid"] == "${DS_PROMETHEUS}"
    for expr in exprs:
        for name in re.findall(r"\bvoxstage_\w+", expr):
            assert name in exported, f"{name} is not a voxstage metric"
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed")
    concrete = [
        e.replace("$__rate_interval", "1m").replace("$api", ".*").replace("$stage", ".*") for e in exprs
    ]
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"voxstage:panel{i}", "expr": e} for i, e in enumerate(concrete)]}]}  # fmt: skip
    path = tmp_path / "rules.yml"
    path.write_text(yaml.safe_dump(rules))
    run = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
    provisioning = REPO / "deploy" / "grafana" / "provisioning"
    source = yaml.safe_load((provisioning / "datasources" / "prometheus.yaml").read_text())
    assert source["datasources"][0]["url"] == "http://prometheus:9090"
    provider = yaml.safe_load((provisioning / "dashboards" / "voxstage.yaml").read_text())
    mounted = [v for v in compose()["services"]["grafana"]["volumes"] if "dashboards:" in v][0]
    assert provider["providers"][0]["options"]["path"] == mounted.split(":")[1]
