"""The house's import rules, read from the source, in every direction: the shared floor (``voxstage`` less its
launcher) imports no stage, no gateway and no launcher; the talker and the codec import nothing of each
other; the gateway imports neither (nor the stage runtime, but for the link TLS both sides speak); only the
launcher (``voxstage.launch``) composes them all. Inside the gateway, its faces borrow nothing from each
other and the core no face; the modules of the runtime and of ``voxstage.config`` import each other one way.

Every import in a file counts, also one inside a function or an ``if TYPE_CHECKING`` block: it never runs at
import time, yet it ties the modules together (a later edit turns it into a runtime loop, and type checkers
follow it).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# Where each import namespace lives on disk (each import name is its folder; the floor is under src/).
HOMES = {
    "services.talker": ROOT / "services" / "talker",
    "services.codec": ROOT / "services" / "codec",
    "gateway": ROOT / "gateway",
    "voxstage.stage": ROOT / "src" / "voxstage" / "stage",
    "voxstage.config": ROOT / "src" / "voxstage" / "config",
}


def imported_modules(path: Path) -> Iterator[str]:
    """Every absolute module name ``path`` imports, anywhere in its text (``from a import b`` gives ``a.b``
    too, since ``b`` may be a submodule)."""
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.ImportFrom) and node.module is not None and node.level == 0:
            yield node.module
            yield from (f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)


def _within(name: str, namespace: str) -> bool:
    return name == namespace or name.startswith(namespace + ".")


@pytest.mark.parametrize(
    "importer,forbidden",
    [
        ("services.talker", ("services.codec", "gateway", "voxstage.launch")),
        ("services.codec", ("services.talker", "gateway", "voxstage.launch")),
        # The gateway dials the stages over the same mutual-TLS links they serve (voxstage.stage.tls) and
        # uses nothing else of the stage runtime.
        ("gateway", ("services.talker", "services.codec", "voxstage.stage", "voxstage.launch")),
        ("voxstage.stage", ("services.talker", "services.codec", "gateway")),
    ],
)
def test_namespace_does_not_import(importer: str, forbidden: tuple[str, ...]) -> None:
    files = sorted(HOMES[importer].rglob("*.py"))
    assert files, importer
    found = {
        f"{path.relative_to(ROOT)} imports {name}"
        for path in files
        for name in imported_modules(path)
        if any(_within(name, f) for f in forbidden) and not _within(name, "voxstage.stage.tls")
    }
    assert not found, sorted(found)


FACES = ("gateway.http", "gateway.grpc", "gateway.realtime")


@pytest.mark.parametrize("face", FACES)
def test_gateway_faces_borrow_nothing_from_each_other(face: str) -> None:
    """A face translates its wire form to the core (``gateway.tts``, ``gateway.duplex``, routing, admission);
    what two faces share lives in the core, so a face never imports another."""
    others = tuple(f for f in FACES if f != face)
    folder = ROOT / "gateway" / face.split(".")[1]
    found = {
        f"{path.relative_to(ROOT)} imports {name}"
        for path in sorted(folder.rglob("*.py"))
        for name in imported_modules(path)
        if any(_within(name, other) for other in others)
    }
    assert not found, sorted(found)


def test_gateway_core_imports_no_face() -> None:
    """Only the process module (``gateway/app.py``) composes the faces; the core serves all of them."""
    faces = {ROOT / "gateway" / face.split(".")[1] for face in FACES}
    found = {
        f"{path.relative_to(ROOT)} imports {name}"
        for path in sorted((ROOT / "gateway").rglob("*.py"))
        if path.name != "app.py" or path.parent != ROOT / "gateway"
        if not any(folder in path.parents for folder in faces)
        for name in imported_modules(path)
        if any(_within(name, face) for face in FACES)
    }
    assert not found, sorted(found)


FLOOR = ROOT / "src" / "voxstage"
# `python -m voxstage` is the command line's entry point, run and never imported: it hands over to the
# launcher.
ENTRY = FLOOR / "__main__.py"


def test_the_floor_imports_no_stage_no_gateway_and_no_launcher() -> None:
    upper = ("services", "gateway", "voxstage.launch")
    files = [p for p in sorted(FLOOR.rglob("*.py")) if FLOOR / "launch" not in p.parents and p != ENTRY]
    assert len(files) > 50
    found = {
        f"{path.relative_to(ROOT)} imports {name}"
        for path in files
        for name in imported_modules(path)
        if any(_within(name, u) for u in upper)
    }
    assert not found, sorted(found)


def test_only_the_entry_point_reaches_up_to_the_launcher() -> None:
    names = set(imported_modules(ENTRY))
    assert any(_within(n, "voxstage.launch") for n in names), names
    assert not any(_within(n, "services") or _within(n, "gateway") for n in names), names


def submodule_graph(package: str) -> dict[str, set[str]]:
    """Which of ``package``'s modules each one imports; a name taken from the package itself (``from
    voxstage.config import DeployConfig``) is an import of its ``__init__``."""
    folder = HOMES[package]
    modules = {path.stem for path in folder.glob("*.py")}

    def submodule(name: str) -> str | None:
        if not name.startswith(package + "."):
            return None
        head = name[len(package) + 1 :].split(".")[0]
        return head if head in modules else "__init__"

    return {
        path.stem: {m for name in imported_modules(path) if (m := submodule(name)) and m != path.stem}
        for path in folder.glob("*.py")
    }


@pytest.mark.parametrize("package", ["voxstage.stage", "voxstage.config"])
def test_package_modules_import_each_other_without_loops(package: str) -> None:
    try:
        tuple(TopologicalSorter(submodule_graph(package)).static_order())
    except CycleError as exc:
        raise AssertionError(f"import loop in {package}: {' -> '.join(exc.args[1])}") from exc


def test_the_loops_once_untied_stay_untied() -> None:
    stage, config = submodule_graph("voxstage.stage"), submodule_graph("voxstage.config")
    assert "stream" in stage["servicer"] and "servicer" not in stage["stream"]
    # deploy.py runs the checks from its validator (checks.py types against a protocol, not DeployConfig), and
    # describe.py renders a DeployConfig (deploy.py has no rendering methods).
    assert "checks" in config["deploy"] and "deploy" not in config["checks"]
    assert "deploy" in config["describe"] and "describe" not in config["deploy"]
