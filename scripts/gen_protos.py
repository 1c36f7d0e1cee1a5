"""Regenerates the checked-in Python code for every .proto under protos/.

    python scripts/gen_protos.py              # write into src/ (then commit the result)
    python scripts/gen_protos.py --out DIR    # write elsewhere (the freshness test compares DIR with src/)

Protos are laid out by package path and compiled with ``-I protos``, so ``voxstage/v1/speech.proto`` becomes
``src/voxstage/v1/speech_pb2.py`` and its imports read ``from voxstage.v1 import speech_pb2`` without any
rewriting. grpcio-tools must be the version pinned in pyproject.toml: the generated code embeds it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PROTO_ROOT = REPO / "protos"
DEFAULT_OUT = REPO / "src"
# Suffixes protoc writes for one .proto; used to find generated files when comparing trees.
GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")


def proto_files(root: Path = PROTO_ROOT) -> list[Path]:
    files = sorted(root.rglob("*.proto"))
    if not files:
        raise SystemExit(f"no .proto files under {root}")
    return files


def generated_files(out: Path, protos: list[Path] | None = None, root: Path = PROTO_ROOT) -> list[Path]:
    """The files protoc writes under ``out`` for ``protos`` (relative to ``out``)."""
    found: list[Path] = []
    for proto in protos or proto_files(root):
        rel = proto.relative_to(root).with_suffix("")
        found += [rel.with_name(rel.name + suffix) for suffix in GENERATED_SUFFIXES]
    return found


def generate(out: Path, root: Path = PROTO_ROOT) -> list[Path]:
    """Runs protoc for every proto under ``root`` into ``out``; returns the written files (relative)."""
    # Imported here so ``--help`` works without grpcio-tools installed.
    import grpc_tools
    from grpc_tools import protoc

    protos = proto_files(root)
    out.mkdir(parents=True, exist_ok=True)
    # grpc_tools ships the well-known types (google/protobuf/*.proto) next to its package.
    well_known = Path(grpc_tools.__file__).resolve().parent / "_proto"
    args = [
        "grpc_tools.protoc",
        f"-I{root}",
        f"-I{well_known}",
        f"--python_out={out}",
        f"--pyi_out={out}",
        f"--grpc_python_out={out}",
        # Absolute paths inside an -I root: protoc names each file relative to that root
        # ("voxstage/v1/speech.proto"), whatever the caller's working directory.
        *(str(p) for p in protos),
    ]
    rc = protoc.main(args)
    if rc != 0:
        raise SystemExit(f"protoc failed with exit code {rc}")
    written = generated_files(out, protos, root)
    missing = [str(p) for p in written if not (out / p).is_file()]
    if missing:
        raise SystemExit(f"protoc did not write: {', '.join(missing)}")
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output root (default: src/)")
    ns = parser.parse_args(argv)
    for rel in generate(ns.out.resolve()):
        print(ns.out / rel)
    return 0


if __name__ == "__main__":
    sys.exit(main())
