"""One place per family: no code outside a family's own folders and the registry names a family.

A family's code names (``qwen3``, ``audio8``, ``arktts``, ``personaplex`` and its codec ``mimi``, lowercase as
code spells them) may appear only in the family's folders (the packages its descriptor's loaders live in),
the registry (``src/voxstage/families``), deploy files, docs and tests (golden-fixture builders live in
``tests/golden_builders``). A tool that exists for one family (its engine benchmark, its reference's) lives
in the family's bench folder, which its descriptor declares (``Bench.folder``); there is no list of
exceptions. Prose names (Qwen3-TTS, PersonaPlex) in comments are allowed: they explain, they dispatch
nothing. Everything else asks the registry, so adding a family is a folder per stage, a descriptor and a
registry line.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from voxstage import families

ROOT = Path(__file__).resolve().parents[2]
CODE_NAMES = re.compile(r"qwen3|audio8|arktts|personaplex|mimi")
# Trees and files that may name families: the registry, deploy files, docs, tests.
ALLOWED_TREES = ("src/voxstage/families/", "deploy/", "docs/", "tests/", "bench/results/")
ALLOWED_FILES = ("README.md", "Dockerfile", "docker-compose.yml", ".dockerignore", ".gitignore")
def family_folders() -> set[str]:
    """Each registered family's packages in both stages (where its descriptor's loaders live) and its bench
    folder (``Bench.folder``)."""
    folders = set()
    for fam in families.families():
        for ref in (fam.talker, fam.codec, *fam.preset_writers):
            module = ref.partition(":")[0]
            folders.add(module.rpartition(".")[0].replace(".", "/") + "/")
        if fam.bench is not None and fam.bench.folder:
            folders.add(fam.bench.folder.rstrip("/") + "/")
    return folders


def tracked_files() -> list[str]:
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return [line for line in out.splitlines() if line]


def test_no_code_outside_a_family_folder_names_a_family() -> None:
    folders = family_folders()
    # the checks below see every family's folders: both stages' (two families may share one) and its bench's
    assert len(folders) >= 3 * len(families.families()) - 1
    found = []
    for name in tracked_files():
        allowed = name in ALLOWED_FILES or name.endswith(".md")  # Markdown is docs
        if allowed or name.startswith((*ALLOWED_TREES, *folders)):
            continue
        path = ROOT / name
        if not path.is_file() or path.suffix in (".npz", ".png", ".gz", ".xz", ".pt"):
            continue
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        found += [
            f"{name}:{number}: {line.strip()}"
            for number, line in enumerate(text.splitlines(), 1)
            if CODE_NAMES.search(line)
        ]
    assert not found, "family names outside the families' folders:\n" + "\n".join(found)


def test_every_bench_folder_holds_the_scripts_its_family_names() -> None:
    """A family's bench folder exists, lies under bench/families/, and holds the scripts and modules its
    descriptor names, so the allowed folders above are real ones."""
    tracked = set(tracked_files())
    for fam in families.families():
        bench = fam.bench
        if bench is None:
            continue
        assert bench.folder == f"bench/families/{fam.name}", fam.name
        scripts = [bench.engine_script, bench.reference_script, bench.reference_export]
        modules = [bench.kv_fp8.replace(".", "/") + ".py"] if bench.kv_fp8 else []
        paths = [f"{bench.folder}/{s}" for s in scripts if s] + modules
        assert paths and all(p in tracked and p.startswith(bench.folder + "/") for p in paths), paths
