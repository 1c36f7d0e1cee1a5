"""CI freshness check: the checked-in generated code is exactly what scripts/gen_protos.py writes today."""

from __future__ import annotations

import difflib
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
SRC = REPO / "src"
GENERATED_GLOBS = ("*_pb2.py", "*_pb2.pyi", "*_pb2_grpc.py")


def _generated_tree(root: Path) -> dict[Path, bytes]:
    found: dict[Path, bytes] = {}
    for pattern in GENERATED_GLOBS:
        for path in root.rglob(pattern):
            found[path.relative_to(root)] = path.read_bytes()
    return found


def test_checked_in_code_matches_a_fresh_generation(tmp_path: Path) -> None:
    out = tmp_path / "gen"
    run = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "gen_protos.py"), "--out", str(out)],
        capture_output=True,
        text=True,
        cwd=tmp_path,  # the output must not depend on the working directory
        timeout=120,
    )
    assert run.returncode == 0, f"gen_protos.py failed:\n{run.stdout}\n{run.stderr}"

    fresh = _generated_tree(out)
    checked_in = _generated_tree(SRC)
    assert fresh, "gen_protos.py wrote no generated files"
    missing = sorted(str(p) for p in fresh.keys() - checked_in.keys())
    stray = sorted(str(p) for p in checked_in.keys() - fresh.keys())
    assert not missing, f"generated files not checked in (run scripts/gen_protos.py): {missing}"
    assert not stray, f"checked-in generated files with no .proto source (delete them): {stray}"

    stale: list[str] = []
    for rel, data in sorted(fresh.items()):
        if checked_in[rel] != data:
            diff = difflib.unified_diff(
                checked_in[rel].decode(errors="replace").splitlines(),
                data.decode(errors="replace").splitlines(),
                fromfile=f"src/{rel}",
                tofile="fresh",
                lineterm="",
                n=1,
            )
            stale.append("\n".join(list(diff)[:20]))
    assert not stale, "checked-in generated code is stale; run scripts/gen_protos.py:\n" + "\n\n".join(stale)


def test_every_generated_package_is_importable_by_its_proto_package() -> None:
    # `-I protos` with package-shaped folders gives absolute imports that need no rewriting; every folder
    # holding generated code must therefore be a package.
    for rel in _generated_tree(SRC):
        for parent in rel.parents:
            if parent == Path("."):
                break
            assert (SRC / parent / "__init__.py").is_file(), f"src/{parent} lacks __init__.py"
