"""deploy/k8s: every overlay renders, validates against the Kubernetes API schemas, passes checkov with only
the suppressions written in the manifests, and agrees with the code it runs (CLI flags, deploy files, health
service names, ports, metric names).

Rendering: ``render()`` below is a small kustomize of the subset the manifests use (resources, components,
namespace, configMapGenerator with files/literals and a content-hash name suffix, images, and
``$patch: delete`` patches); any other kustomization field makes it fail rather than guess. Where a real
kustomize is on the machine (``kubectl kustomize``, or ``$VOXSTAGE_KUSTOMIZE``),
``test_render_matches_kustomize`` checks that both give the same objects (generated ConfigMap names compared
without their hash suffix), so what is validated is what ``kubectl apply -k`` would apply.

Validators: ``kubernetes-validate`` (a dev dependency; strict schemas of Kubernetes 1.31, the oldest version
supported here, and 1.34, which the pair overlay's resource.k8s.io/v1 needs) and ``checkov`` (in its own
virtualenv, ``make checkov``: it pins old versions of networkx and packaging that the project's venv must not
get). ServiceMonitor has no bundled schema: it is checked by ``test_servicemonitors_match_services``.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
OVERLAYS = sorted(p.name for p in (K8S / "overlays").iterdir() if (p / "kustomization.yaml").exists())
# Optional components, rendered on top of every single-GPU-per-stage overlay so that they are validated too.
OPTIONAL_COMPONENTS = ("monitoring", "autoscaling")
MIN_VERSION = "1.31"
DRA_VERSION = "1.34"  # resource.k8s.io/v1 (the pair overlay's ResourceClaimTemplate)
# The only checkov findings the manifests may suppress, each with its reason in a checkov.io/skipN annotation.
ALLOWED_SKIPS = {"CKV_K8S_43", "CKV_K8S_11"}
CLUSTER_SCOPED = {"Namespace", "PersistentVolume", "StorageClass", "ClusterRole", "ClusterRoleBinding",
                  "CustomResourceDefinition", "DeviceClass", "PriorityClass"}  # fmt: skip
PAIR = "qwen3-tts-pair"
SPLIT = "qwen3-tts-split"  # issue 31's layout 2: talker and codec of one pod on a GPU each
# Overlays whose stages run in one `stages` pod: the optional components' talker/codec targets are gone there.
STAGES_POD = (PAIR, SPLIT)


# -- the kustomize subset ----------------------------------------------------------------------------------

_KUSTOMIZATION_FIELDS = {"apiVersion", "kind", "namespace", "resources", "components", "configMapGenerator",
                         "images", "patches"}  # fmt: skip


def _docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def _kustomize_hash(cm: dict[str, Any]) -> str:
    """A content-hash name suffix in kustomize's form (sha256 of {data, kind, name} as JSON, 10 hex digits
    with 0, 1, 3, a, e mapped to g, h, k, m, t, as api/hasher describes it). kubectl's kustomize gives other
    digits for the same input, so ``test_render_matches_kustomize`` compares names without the suffix."""
    encoded = json.dumps(
        {"data": cm["data"], "kind": "ConfigMap", "name": cm["metadata"]["name"]},
        sort_keys=True, separators=(",", ":"), ensure_ascii=False,
    )  # fmt: skip
    # Go's encoding/json escapes these where Python's does not.
    for ch, esc in (("&", "\\u0026"), ("<", "\\u003c"), (">", "\\u003e"), ("\u2028", "\\u2028"),
                    ("\u2029", "\\u2029")):  # fmt: skip
        encoded = encoded.replace(ch, esc)
    digest = hashlib.sha256(encoded.encode()).hexdigest()[:10]
    return digest.translate(str.maketrans("013ae", "ghkmt"))


def _generate(folder: Path, spec: dict[str, Any]) -> dict[str, Any]:
    unknown = set(spec) - {"name", "files", "literals"}
    assert not unknown, f"{folder}: configMapGenerator field(s) {unknown} are outside the rendered subset"
    data: dict[str, str] = {}
    for entry in spec.get("files", []):
        key, _, rel = entry.rpartition("=") if "=" in entry else (Path(entry).name, "", entry)
        target = (folder / rel).resolve()
        assert target.is_relative_to(folder.resolve()), f"{entry}: kustomize loads files only below {folder}"
        data[key] = target.read_text()
    for entry in spec.get("literals", []):
        key, _, value = entry.partition("=")
        data[key] = value
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": spec["name"]}, "data": data}
    cm["metadata"]["name"] = f"{spec['name']}-{_kustomize_hash(cm)}"
    return cm


def _key(doc: dict[str, Any]) -> tuple[str, str, str]:
    return doc["kind"], doc["metadata"].get("namespace", ""), doc["metadata"]["name"]


_SUFFIX = re.compile(r"^(voxstage-(?:deploy|settings))-[a-z0-9]{10}$")


def _unhashed(doc: Any) -> Any:
    """``doc`` with generated ConfigMap names (and references to them) stripped of their hash suffix."""
    if isinstance(doc, dict):
        return {k: _unhashed(v) for k, v in doc.items()}
    if isinstance(doc, list):
        return [_unhashed(v) for v in doc]
    return _SUFFIX.sub(r"\1", doc) if isinstance(doc, str) else doc


def _pod_specs(doc: dict[str, Any]) -> list[dict[str, Any]]:
    if doc["kind"] in {"Deployment", "StatefulSet", "DaemonSet", "Job"}:
        return [doc["spec"]["template"]["spec"]]
    return []


def _containers(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [c for spec in _pod_specs(doc) for c in spec.get("initContainers", []) + spec["containers"]]


def _rename_configmap_refs(docs: list[dict[str, Any]], renamed: dict[str, str]) -> None:
    for doc in docs:
        for spec in _pod_specs(doc):
            for vol in spec.get("volumes", []):
                if "configMap" in vol:
                    vol["configMap"]["name"] = renamed.get(vol["configMap"]["name"], vol["configMap"]["name"])
        for c in _containers(doc):
            for src in c.get("envFrom", []):
                if "configMapRef" in src:
                    ref = src["configMapRef"]
                    ref["name"] = renamed.get(ref["name"], ref["name"])
            for env in c.get("env", []):
                ref = env.get("valueFrom", {}).get("configMapKeyRef")
                if ref is not None:
                    ref["name"] = renamed.get(ref["name"], ref["name"])


def _apply_patch(docs: list[dict[str, Any]], patch: dict[str, Any]) -> list[dict[str, Any]]:
    assert patch.get("$patch") == "delete", "only `$patch: delete` patches are in the rendered subset"
    target = (patch["kind"], patch["metadata"]["name"])
    kept = [d for d in docs if (d["kind"], d["metadata"]["name"]) != target]
    assert len(kept) == len(docs) - 1, f"patch deletes {target}, which is not (exactly once) in the build"
    return kept


def render(folder: Path, extra_components: tuple[Path, ...] = ()) -> list[dict[str, Any]]:
    k = yaml.safe_load((folder / "kustomization.yaml").read_text())
    unknown = set(k) - _KUSTOMIZATION_FIELDS
    assert not unknown, f"{folder}: kustomization field(s) {unknown} are outside the rendered subset"
    docs: list[dict[str, Any]] = []
    for entry in k.get("resources", []):
        path = folder / entry
        docs += render(path) if path.is_dir() else _docs(path)
    for component in [folder / c for c in k.get("components", [])] + list(extra_components):
        docs = _apply_component(docs, component)
    renamed: dict[str, str] = {}
    for spec in k.get("configMapGenerator", []):
        cm = _generate(folder, spec)
        renamed[spec["name"]] = cm["metadata"]["name"]
        docs.append(cm)
    for entry in k.get("patches", []):
        assert set(entry) <= {"patch", "path"}, f"{folder}: patch targets are outside the rendered subset"
        text = entry["patch"] if "patch" in entry else (folder / entry["path"]).read_text()
        docs = _apply_patch(docs, yaml.safe_load(text))
    if "namespace" in k:
        for doc in docs:
            if doc["kind"] not in CLUSTER_SCOPED:
                doc["metadata"]["namespace"] = k["namespace"]
    for image in k.get("images", []):
        for c in (c for d in docs for c in _containers(d)):
            if re.split(r"[:@]", c["image"], maxsplit=1)[0] == image["name"]:
                c["image"] = f"{image.get('newName', image['name'])}:{image['newTag']}"
    _rename_configmap_refs(docs, renamed)
    return docs


def _apply_component(docs: list[dict[str, Any]], folder: Path) -> list[dict[str, Any]]:
    k = yaml.safe_load((folder / "kustomization.yaml").read_text())
    assert k["kind"] == "Component" and set(k) <= {"apiVersion", "kind", "resources", "patches"}, folder
    docs = docs + [d for entry in k.get("resources", []) for d in _docs(folder / entry)]
    for entry in k.get("patches", []):
        docs = _apply_patch(docs, yaml.safe_load(entry["patch"]))
    return docs


def _builds() -> dict[str, list[dict[str, Any]]]:
    builds = {name: render(K8S / "overlays" / name) for name in OVERLAYS}
    for name in OVERLAYS:
        if name not in STAGES_POD:
            extra = tuple(K8S / "components" / c for c in OPTIONAL_COMPONENTS)
            builds[f"{name}+optional"] = render(K8S / "overlays" / name, extra)
    return builds


@pytest.fixture(scope="module")
def builds() -> dict[str, list[dict[str, Any]]]:
    return _builds()


def _by_kind(docs: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


def _settings(docs: list[dict[str, Any]]) -> dict[str, str]:
    (cm,) = [
        d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].startswith("voxstage-settings-")
    ]
    return cm["data"]


# -- rendering -------------------------------------------------------------------------------------------


def test_overlays_exist() -> None:
    assert {"qwen3-tts", "audio8-tts", "personaplex", PAIR, SPLIT} <= set(OVERLAYS)


def _kustomize() -> list[str] | None:
    if os.environ.get("VOXSTAGE_KUSTOMIZE"):
        return [os.environ["VOXSTAGE_KUSTOMIZE"], "build"]
    kubectl = shutil.which("kubectl")
    return [kubectl, "kustomize"] if kubectl else None


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_render_matches_kustomize(overlay: str, tmp_path: Path) -> None:
    """The Python render equals kustomize's, for the overlay alone and with the optional components added the
    way docs/scaling.md says (a `components:` entry in the overlay's own kustomization)."""
    tool = _kustomize()
    if tool is None:
        pytest.skip("no kustomize (kubectl kustomize or $VOXSTAGE_KUSTOMIZE) on this machine")
    cases = [(K8S / "overlays" / overlay, ())]
    if overlay not in STAGES_POD:
        copy_dir = tmp_path / overlay
        shutil.copytree(K8S / "overlays" / overlay, copy_dir)
        k = yaml.safe_load((copy_dir / "kustomization.yaml").read_text())
        # kustomize takes only relative paths to other kustomizations.
        k["resources"] = [
            os.path.relpath(K8S / "base", copy_dir) if r == "../../base" else r for r in k["resources"]
        ]
        k["components"] = [os.path.relpath(K8S / "components" / c, copy_dir) for c in OPTIONAL_COMPONENTS]
        (copy_dir / "kustomization.yaml").write_text(yaml.safe_dump(k))
        cases.append((copy_dir, ()))
    for folder, extra in cases:
        out = subprocess.run([*tool, str(folder)], capture_output=True, text=True, timeout=60, check=True)
        theirs = {_key(d): d for d in (_unhashed(d) for d in yaml.safe_load_all(out.stdout) if d)}
        if folder.parent == tmp_path:  # the same build through extra_components
            ours_list = render(
                K8S / "overlays" / overlay, tuple(K8S / "components" / c for c in OPTIONAL_COMPONENTS)
            )
        else:
            ours_list = render(folder, extra)
        ours = {_key(d): d for d in map(_unhashed, ours_list)}
        assert sorted(ours) == sorted(theirs)
        for key, doc in ours.items():
            assert doc == theirs[key], f"{overlay}: {key} differs from kustomize's render"


def test_seed_copies_are_byte_equal() -> None:
    """The ConfigMaps carry the seed deploy files unchanged: each overlay's copy equals deploy/<file>."""
    for overlay in OVERLAYS:
        k = yaml.safe_load((K8S / "overlays" / overlay / "kustomization.yaml").read_text())
        (spec,) = [g for g in k["configMapGenerator"] if g["name"] == "voxstage-deploy"]
        (entry,) = spec["files"]
        assert entry.startswith("deploy.yaml="), "the containers read --config /etc/voxstage/deploy.yaml"
        copy_path = K8S / "overlays" / overlay / entry.removeprefix("deploy.yaml=")
        assert copy_path.read_bytes() == (ROOT / "deploy" / copy_path.name).read_bytes(), copy_path


# -- schema validation -----------------------------------------------------------------------------------


def test_kubernetes_schemas(builds: dict[str, list[dict[str, Any]]]) -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    skipped = set()
    for name, docs in builds.items():
        versions = [DRA_VERSION] if name == PAIR else [MIN_VERSION, DRA_VERSION]
        for doc in docs:
            if doc["apiVersion"].startswith("monitoring.coreos.com/"):
                skipped.add(doc["kind"])  # CRD: no bundled schema (test_servicemonitors_match_services)
                continue
            for version in versions:
                try:
                    kubernetes_validate.validate(copy.deepcopy(doc), version, strict=True)
                except kubernetes_validate.ValidationError as exc:
                    pytest.fail(f"{name}: {_key(doc)} is not valid Kubernetes {version}: {exc.message}")
    assert skipped == {"ServiceMonitor"}


def test_schema_validation_rejects_a_typo() -> None:
    """The strict schemas catch a misspelt field (what a silently ignored probe setting would be)."""
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    talker = copy.deepcopy(_by_kind(render(K8S / "overlays" / "qwen3-tts"), "Deployment")["talker"])
    talker["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {"grpc": {"port": 50061}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(talker, MIN_VERSION, strict=True)


# -- checkov ---------------------------------------------------------------------------------------------

# A Deployment with none of the hardening: checkov must flag it, or the run below proves nothing.
CANARY = """apiVersion: apps/v1
kind: Deployment
metadata: {name: canary, namespace: canary}
spec:
  selector: {matchLabels: {app: canary}}
  template:
    metadata: {labels: {app: canary}}
    spec:
      containers:
        - {name: canary, image: "canary:latest"}
"""


def _checkov() -> str | None:
    for candidate in (os.environ.get("VOXSTAGE_CHECKOV"), str(ROOT / ".tools/checkov/bin/checkov"),
                      shutil.which("checkov")):  # fmt: skip
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return candidate
    return None


def test_checkov(builds: dict[str, list[dict[str, Any]]], tmp_path: Path) -> None:
    checkov = _checkov()
    if checkov is None:
        if os.environ.get("CI"):
            pytest.fail("checkov is not installed: `make checkov` installs it into .tools/checkov")
        pytest.skip("checkov is not installed (`make checkov`)")
    for name, docs in builds.items():
        (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump_all(docs, sort_keys=False))
    (tmp_path / "canary.yaml").write_text(CANARY)
    out = subprocess.run(
        [checkov, "-d", str(tmp_path), "--framework", "kubernetes", "-o", "json", "--compact",
         "--skip-download"],
        capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    report = json.loads(out.stdout)
    results = report["results"]
    failed = [r for r in results["failed_checks"] if not r["file_path"].endswith("canary.yaml")]
    canary = {r["check_id"] for r in results["failed_checks"] if r["file_path"].endswith("canary.yaml")}
    passed = [r for r in results["passed_checks"] if not r["file_path"].endswith("canary.yaml")]
    assert {"CKV_K8S_8", "CKV_K8S_9", "CKV_K8S_14", "CKV_K8S_22", "CKV_K8S_40"} <= canary, canary
    assert not failed, "unsuppressed checkov findings:\n" + "\n".join(
        f"{r['check_id']} {r['check_name']}: {r['file_path']} {r['resource']}" for r in failed
    )
    assert len(passed) > 100
    for r in results["skipped_checks"]:
        assert r["check_id"] in ALLOWED_SKIPS, f"new suppression {r['check_id']} in {r['resource']}"
        comment = r["check_result"].get("suppress_comment", "")
        assert len(comment) > 20, f"{r['check_id']} suppressed without a reason"


# -- agreement with the code ------------------------------------------------------------------------------


def _expand(arg: str, env: dict[str, str]) -> str:
    def sub(m: re.Match[str]) -> str:
        assert m.group(1) in env, f"$({m.group(1)}) is not set in the container's environment"
        return env[m.group(1)]

    return re.sub(r"\$\(([A-Z_][A-Z0-9_]*)\)", sub, arg)


def _container_env(container: dict[str, Any], settings: dict[str, str]) -> dict[str, str]:
    env = dict(settings) if container.get("envFrom") else {}
    for e in container.get("env", []):
        if "value" in e:
            env[e["name"]] = e["value"]
        elif e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "metadata.namespace":
            env[e["name"]] = "voxstage-ns"
    return env


def _voxstage_containers(docs: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    return [(d["metadata"]["name"], c) for d in docs if d["kind"] == "Deployment" for c in _containers(d)]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_commands_parse_and_config_loads(overlay: str, tmp_path: Path) -> None:
    """Each container's command line is accepted by voxstage's own parser, and its deploy file (the ConfigMap)
    with its --set overrides passes validate-config's checks on CUDA."""
    from voxstage.config import load_deploy_config
    from voxstage.launch.cli import build_parser

    docs = render(K8S / "overlays" / overlay)
    settings = _settings(docs)
    (deploy_cm,) = [
        d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].startswith("voxstage-deploy-")
    ]
    (tmp_path / "deploy.yaml").write_text(deploy_cm["data"]["deploy.yaml"])
    parser = build_parser()
    roles = set()
    for _, c in _voxstage_containers(docs):
        argv = [_expand(a, _container_env(c, settings)) for a in c["command"]]
        assert argv[:3] == ["python", "-m", "voxstage"]
        args = parser.parse_args(argv[3:])
        roles.add(args.command)
        assert args.config == "/etc/voxstage/deploy.yaml"
        config = load_deploy_config(tmp_path / "deploy.yaml", platform="cuda", overrides=args.overrides or ())
        assert config.talker.max_num_seqs == int(settings["TALKER_MAX_NUM_SEQS"])
        assert config.codec.max_num_seqs == int(settings["CODEC_MAX_NUM_SEQS"])
    assert roles == {"talker", "codec", "gateway"}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_ports_probes_and_drain_agree(overlay: str) -> None:
    from services.codec.servicer import SERVICE_NAME as CODEC_SERVICE
    from services.talker.servicer import SERVICE_NAME as TALKER_SERVICE

    docs = render(K8S / "overlays" / overlay)
    services = _by_kind(docs, "Service")
    health = {"talker": TALKER_SERVICE, "codec": CODEC_SERVICE}
    for deployment, c in _voxstage_containers(docs):
        role = c["command"][3]
        argv = c["command"]
        flag = {"talker": "--port", "codec": "--port", "gateway": "--grpc-port"}[role]
        grpc_port = int(argv[argv.index(flag) + 1])
        ports = {p["name"]: p["containerPort"] for p in c["ports"]}
        assert ports["grpc"] == grpc_port
        assert c["readinessProbe"]["grpc"]["port"] == grpc_port
        if role in health:
            assert ports["metrics"] == int(argv[argv.index("--metrics-port") + 1])
            assert c["startupProbe"]["grpc"] == {"port": grpc_port, "service": health[role]}
            assert c["readinessProbe"]["grpc"]["service"] == health[role]
            startup_s = c["startupProbe"]["periodSeconds"] * c["startupProbe"]["failureThreshold"]
            assert startup_s >= 300, (
                "CUDA-graph capture and checkpoint load need minutes (docs/benchmarks.md)"
            )
            # The headless Service of the role reaches this port by name.
            svc = services[role]
            assert svc["spec"]["clusterIP"] == "None"
            assert {p["name"]: p["port"] for p in svc["spec"]["ports"]}["grpc"] == grpc_port
        grace = float(argv[argv.index("--drain-grace" if role in health else "--grace") + 1])
        pod = _by_kind(docs, "Deployment")[deployment]["spec"]["template"]["spec"]
        pre_stop = c.get("lifecycle", {}).get("preStop", {}).get("sleep", {}).get("seconds", 0)
        assert pod["terminationGracePeriodSeconds"] >= pre_stop + grace + 5
        live = c["livenessProbe"]
        assert live["periodSeconds"] * live["failureThreshold"] > grace, "liveness must outlast the drain"
    # The gateway reaches the stages by their headless names.
    (gateway,) = [c for _, c in _voxstage_containers(docs) if c["command"][3] == "gateway"]
    cmd = gateway["command"]
    assert cmd[cmd.index("--talker") + 1].startswith("talker.$(POD_NAMESPACE).svc.")
    assert cmd[cmd.index("--codec") + 1].startswith("codec.$(POD_NAMESPACE).svc.")


def test_servicemonitors_match_services() -> None:
    docs = render(K8S / "overlays" / "qwen3-tts", tuple(K8S / "components" / c for c in OPTIONAL_COMPONENTS))
    services = list(_by_kind(docs, "Service").values())
    monitors = _by_kind(docs, "ServiceMonitor")
    assert len(monitors) == 3
    for monitor in monitors.values():
        want = monitor["spec"]["selector"]["matchLabels"]
        (svc,) = [s for s in services if want.items() <= s["metadata"]["labels"].items()]
        names = {p["name"] for p in svc["spec"]["ports"]}
        assert {e["port"] for e in monitor["spec"]["endpoints"]} <= names


def test_hpa_metrics_come_from_the_adapter_rules() -> None:
    from voxstage import metrics

    rules = yaml.safe_load((K8S / "components/autoscaling/prometheus-adapter-rules.yaml").read_text())
    served = {r["name"]["as"]: r for r in rules["rules"]["custom"]}
    hpas = _by_kind(
        render(K8S / "overlays" / "qwen3-tts", (K8S / "components/autoscaling",)), "HorizontalPodAutoscaler"
    )
    assert set(hpas) == {"talker", "codec"}
    for hpa in hpas.values():
        for m in hpa["spec"]["metrics"]:
            assert m["pods"]["metric"]["name"] in served
    exported = {m._name for m in (metrics.SLOTS_IN_USE, metrics.SLOTS_TOTAL)}  # noqa: SLF001
    for rule in served.values():
        for name in re.findall(r"\b(voxstage_[a-z_]+)\{", rule["seriesQuery"] + rule["metricsQuery"]):
            assert name in exported, f"{name} is not a metric voxstage exports"


def test_pair_shares_one_gpu_claim() -> None:
    docs = render(K8S / "overlays" / PAIR)
    deployments = _by_kind(docs, "Deployment")
    assert set(deployments) == {"stages", "gateway"}
    pod = deployments["stages"]["spec"]["template"]["spec"]
    assert [c["name"] for c in pod["containers"]] == ["talker", "codec"]
    (claim,) = pod["resourceClaims"]
    for c in pod["containers"]:
        assert c["resources"]["claims"] == [{"name": claim["name"]}]
        assert "nvidia.com/gpu" not in c["resources"].get("limits", {})
    labels = deployments["stages"]["spec"]["template"]["metadata"]["labels"]
    assert labels["voxstage/talker"] == labels["voxstage/codec"] == "true"
    settings = _settings(docs)
    fractions = float(settings["TALKER_GPU_MEMORY_UTILIZATION"]) + float(
        settings["CODEC_GPU_MEMORY_UTILIZATION"]
    )
    assert fractions <= 1.0
    # One PDB per pod: the eviction API refuses pods that two PDBs select.
    pdbs = _by_kind(docs, "PodDisruptionBudget").values()
    for d in deployments.values():
        pod_labels = d["spec"]["template"]["metadata"]["labels"]
        assert sum(p["spec"]["selector"]["matchLabels"].items() <= pod_labels.items() for p in pdbs) == 1


def test_split_gives_each_stage_a_gpu_of_its_own() -> None:
    """The split pod is the pair pod but for the GPU: each container asks the device plugin for one GPU (so
    they are two), no shared claim; everything else (commands, probes, volumes, labels) stays the pair's."""
    split = _by_kind(render(K8S / "overlays" / SPLIT), "Deployment")
    pair = _by_kind(render(K8S / "overlays" / PAIR), "Deployment")
    assert set(split) == {"stages", "gateway"}
    pod = copy.deepcopy(split["stages"]["spec"]["template"]["spec"])
    assert "resourceClaims" not in pod and [c["name"] for c in pod["containers"]] == ["talker", "codec"]
    for c in pod["containers"]:
        assert c["resources"]["requests"]["nvidia.com/gpu"] == c["resources"]["limits"]["nvidia.com/gpu"] == 1
        assert "claims" not in c["resources"]
        del c["resources"]["requests"]["nvidia.com/gpu"], c["resources"]["limits"]["nvidia.com/gpu"]
    theirs = copy.deepcopy(pair["stages"]["spec"]["template"]["spec"])
    del theirs["resourceClaims"]
    for c in theirs["containers"]:
        del c["resources"]["claims"]
    assert pod == theirs
    assert {k: v for k, v in split["stages"]["spec"].items() if k != "template"} == {
        k: v for k, v in pair["stages"]["spec"].items() if k != "template"
    }
