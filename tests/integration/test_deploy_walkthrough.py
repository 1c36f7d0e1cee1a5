"""docs/deploy.md, followed on CPU (issue 29): the GPU image and the real-checkpoint path had never run.

The walkthrough's commands are read from the page. What cannot run here is left out: ``hf download`` (its
folder is written from the golden fixtures instead, in the released Qwen3-TTS layout) and the Docker daemon
(the copy into the ``models`` volume runs as the page's ``cp``; ``docker compose up`` runs as the commands
``docker-compose.yml`` gives its services, with the page's ``VOXSTAGE_DEPLOY`` / ``VOXSTAGE_MODEL`` and the
volume under a temporary folder). The page's checks then run against that stack as written.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import wave
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import yaml
from packaging.version import Version

from tests import golden
from tests.integration.deploykit import REPO, dockerfile_base, start_compose_stack
from voxstage.config import load_deploy_config

DOC = REPO / "docs" / "deploy.md"
SEEDS = ("deploy/qwen3_tts.yaml", "deploy/audio8_tts.yaml", "deploy/personaplex.yaml")
CHECKED = "2026-12-02"  # the day the base image's tag was checked (the page says so)


@dataclass
class Walkthrough:
    downloads: dict[str, str] = field(default_factory=dict)  # folder under models/ -> repository
    copy: list[str] = field(default_factory=list)  # the `docker compose run ... cp` line, as words
    ups: dict[str, str] = field(default_factory=dict)  # deploy file -> VOXSTAGE_MODEL
    checks: list[str] = field(default_factory=list)  # the curl lines


def commands() -> list[str]:
    """Every line of the page's ```bash blocks, continuations joined."""
    out = []
    for block in re.findall(r"```bash\n(.*?)```", DOC.read_text(), flags=re.S):
        out += [ln for ln in block.replace("\\\n", " ").splitlines() if ln.strip()]
    return out


def walkthrough() -> Walkthrough:
    w = Walkthrough()
    for line in commands():
        if m := re.fullmatch(r"hf download (\S+) --local-dir models/(\S+)", line):
            w.downloads[m.group(2)] = m.group(1)
        elif m := re.fullmatch(r"VOXSTAGE_DEPLOY=(\S+) VOXSTAGE_MODEL=(\S+) docker compose up -d", line):
            w.ups[m.group(1)] = m.group(2)
        elif line.startswith("docker compose run "):
            w.copy = shlex.split(line)
        elif line.startswith("curl "):
            w.checks.append(line)
    return w


def overlay_models() -> dict[str, str]:
    """The Kubernetes overlays' seed file -> VOXSTAGE_MODEL: the same folders, one convention."""
    found = {}
    for path in (REPO / "deploy" / "k8s" / "overlays").glob("*/kustomization.yaml"):
        doc = yaml.safe_load(path.read_text())
        gens = {g["name"]: g for g in doc.get("configMapGenerator", [])}
        seed = gens["voxstage-deploy"]["files"][0].split("=", 1)[1]
        settings = dict(lit.split("=", 1) for lit in gens["voxstage-settings"]["literals"])
        found[f"deploy/{seed}"] = settings["VOXSTAGE_MODEL"]
    return found


def test_the_page_names_the_image_the_checkpoints_and_their_folders() -> None:
    text = DOC.read_text()
    base = dockerfile_base()
    assert f"**`{base.image}`**" in text and f"**checked on {CHECKED}**" in text
    assert base.image == f"pytorch/pytorch:{base.torch}-cuda{base.cuda}-cudnn9-runtime"
    assert Version(base.torch) >= Version("2.11.0")  # the torch the GPU evidence ran on (2.11, CUDA 13.0)
    w = walkthrough()
    assert sorted(w.ups) == sorted(SEEDS)  # one `docker compose up` per seed deploy file
    assert sorted(w.downloads.values()) == sorted(
        ["Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice", "Audio8/Audio8-TTS-Preview-0.6b", "nvidia/personaplex-7b-v1"]
    )
    overlays = overlay_models()
    for deploy, model in w.ups.items():
        load_deploy_config(REPO / deploy)  # the seed file loads unchanged
        assert model.startswith("/models/") and model.removeprefix("/models/") in w.downloads, model
        assert overlays.get(deploy, model) == model  # Kubernetes expects the same folder
    compose = (REPO / "docker-compose.yml").read_text()
    assert "${VOXSTAGE_DEPLOY:-" in compose and "${VOXSTAGE_MODEL:-" in compose  # what the page sets
    assert "docs/deploy.md" in (REPO / "README.md").read_text()


def run(line: str, cwd: Path) -> str:
    done = subprocess.run(["bash", "-c", line], cwd=cwd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"{line}\n{done.stdout[-2000:]}{done.stderr[-2000:]}"
    return done.stdout


def test_the_qwen3_walkthrough_on_the_cpu_stack(tmp_path: Path) -> None:
    w = walkthrough()
    model = w.ups["deploy/qwen3_tts.yaml"]
    folder = model.removeprefix("/models/")
    # `hf download ... --local-dir models/<folder>`: the released layout, tiny golden weights.
    host = tmp_path / "host"
    golden.materialize_checkpoint("custom_voice", host / "models" / folder, dtype="bfloat16")
    # The copy into the volume, as the page writes it: `-v "$PWD/models:/import:ro" ... cp ARGS`.
    assert w.copy[w.copy.index("-v") + 1] == "$PWD/models:/import:ro"
    cp = w.copy[w.copy.index("--entrypoint") + 1 :]
    assert cp[:2] == ["cp", "talker"]  # a stage's service: it mounts the volume read-write
    volume = tmp_path / "models"
    volume.mkdir()
    paths = {"/import": host / "models", "/models": volume}
    args = [next((str(p) + a[len(k) :] for k, p in paths.items() if a.startswith(k)), a) for a in cp[2:]]
    subprocess.run(["cp", *args], check=True)
    assert (volume / folder / "speech_tokenizer" / "model.safetensors").is_file()

    stack = start_compose_stack(
        tmp_path, compose_env={"VOXSTAGE_DEPLOY": "deploy/qwen3_tts.yaml", "VOXSTAGE_MODEL": model}
    )
    try:
        cwd = tmp_path / "cwd"
        cwd.mkdir()
        outputs = [
            run(line.replace("localhost:8000", stack.http_url.removeprefix("http://")), cwd)
            for line in w.checks
        ]
        health, models = json.loads(outputs[0]), json.loads(outputs[1])
        assert health == {"status": "ok", "codec_ready": True, "talker_ready": True, "draining": False}
        assert [m["id"] for m in models["data"]] == [folder]  # listed by its folder name
        with wave.open(str(cwd / "hello.wav")) as f:
            assert f.getframerate() == 24_000 and f.getnframes() > 0
        # The Grafana section's metrics exist on the dashboard and on the running processes.
        section = DOC.read_text().split("## Grafana and Prometheus", 1)[1]
        named = set(re.findall(r"`(voxstage_\w+)`", section))
        dashboard = (REPO / "deploy" / "grafana" / "dashboards" / "voxstage.json").read_text()
        live = "".join(httpx.get(stack.metrics_url(s)).text for s in ("gateway", "talker", "codec"))
        assert named and all(n in dashboard and n in live for n in named), named
        assert re.search(r'^voxstage_requests_total\{outcome="ok"\} [1-9]', live, re.M)
        assert 'voxstage_time_to_first_audio_seconds_count{api="http_speech"}' in live
    finally:
        codes = stack.stop()
    assert codes == {"gateway": 0, "codec": 0, "talker": 0}, codes
    # The page says the open gateway warns at start.
    assert "no API keys" in stack.procs["gateway"].log.read_text()
