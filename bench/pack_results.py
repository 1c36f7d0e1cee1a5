"""Keep a benchmark run's results small enough to commit: what the docs cite stays readable, the rest packed.

    python -m bench.pack_results RUN [RUN ...]        # pack each run directory (bench/run_gpu.py --pack)
    python -m bench.pack_results --unpack RUN          # restore every file as the run wrote it
    python -m bench.pack_results --thin RUN [RUN ...]  # round the searches' per-request records (lossy)
    python -m bench.pack_results --drop-records RUN    # drop them, keeping each level's aggregates (lossy)

A run directory keeps its summaries (``summary.*``, Markdown, plots) and its per-phase JSON as files. A
per-phase JSON over ``--max-json-kb`` (the searches' per-request records) is compressed on its own, beside
where it was (``NAME.json.xz``: ``xz -dc`` reads it). Everything else the run wrote for the record (process
logs, Prometheus snapshots, text dumps) goes into one archive per run, ``raw.tar.xz``, with the paths it had
under the run. Packing is deterministic (sorted members, fixed times and owners), so packing the same files
again gives the same bytes; ``--unpack`` undoes it, for a later ``run_gpu.py --phases ...`` that reads them.

``--thin`` and ``--drop-records`` are the lossy steps, for keeping older runs under the committed size limit:
with ``--thin`` every per-request record's floats in a packed JSON (``levels[].records``) keep 4 significant
digits below 1 and 4 decimals above (seconds: 0.1 ms or finer), a fifth less packed; ``--drop-records``
removes the records (each level then says ``records_dropped``: how many there were), for runs of closed
issues whose per-request detail no open question reads. Either way the levels' aggregates, which the docs
cite, stay as they were.
"""

from __future__ import annotations

import argparse
import io
import json
import lzma
import tarfile
from pathlib import Path
from typing import Any

ARCHIVE = "raw.tar.xz"
PACKED_SUFFIXES = (".log", ".prom", ".txt")  # records of the run that no doc cites
MAX_JSON_KB = 100
XZ_PRESET = 9 | lzma.PRESET_EXTREME


def pack_run(run: Path, max_json_kb: int = MAX_JSON_KB) -> None:
    """Pack ``run`` in place (see the module docstring); a run packed before takes the new files in too."""
    archive = run / ARCHIVE
    members: dict[str, bytes] = {}
    if archive.is_file():
        with tarfile.open(archive) as tar:
            for m in tar.getmembers():
                handle = tar.extractfile(m)
                if handle is not None:
                    members[m.name] = handle.read()
    loose = sorted(p for p in run.rglob("*") if p.is_file() and p.suffix in PACKED_SUFFIXES)
    for path in loose:
        members[path.relative_to(run).as_posix()] = path.read_bytes()
    if loose:
        _write_archive(archive, members)
        for path in loose:
            path.unlink()
    for path in sorted(run.rglob("*.json")):
        if path.stat().st_size > max_json_kb * 1024:
            path.with_name(path.name + ".xz").write_bytes(lzma.compress(path.read_bytes(), preset=XZ_PRESET))
            path.unlink()


def _rounded(value: Any) -> Any:
    if isinstance(value, float):
        return float(f"{value:.4g}") if abs(value) < 1 else round(value, 4)
    if isinstance(value, list):
        return [_rounded(v) for v in value]
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    return value


def thin_run(run: Path, drop: bool = False) -> None:
    """Round (``--thin``), or with ``drop`` remove (``--drop-records``), the per-request records of ``run``'s
    packed JSON in place (module docstring)."""
    for path in sorted(run.rglob("*.json.xz")):
        doc = json.loads(lzma.decompress(path.read_bytes()))
        levels = doc.get("levels", []) if isinstance(doc, dict) else []
        if not isinstance(levels, list):
            continue
        searched = [lv for lv in levels if isinstance(lv, dict) and "records" in lv]
        if not searched:
            continue
        for level in searched:
            if drop:
                level["records_dropped"] = len(level.pop("records"))
            else:
                level["records"] = _rounded(level["records"])
        path.write_bytes(lzma.compress(json.dumps(doc, separators=(",", ":")).encode(), preset=XZ_PRESET))


def load_json(path: Path) -> Any:
    """A run's JSON whether packed or not: ``path``, else ``path.xz`` (what ``pack_run`` made of a large
    one); None when neither exists or parses, so a report reads a run that later runs added to."""
    try:
        if path.is_file():
            return json.loads(path.read_text())
        packed = path.with_name(path.name + ".xz")
        if packed.is_file():
            return json.loads(lzma.decompress(packed.read_bytes()))
    except (OSError, ValueError, lzma.LZMAError):
        return None
    return None


def _write_archive(archive: Path, members: dict[str, bytes]) -> None:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in sorted(members):
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(members[name]), 0, 0o644
            tar.addfile(info, io.BytesIO(members[name]))
    archive.write_bytes(lzma.compress(buf.getvalue(), preset=XZ_PRESET))


def unpack_run(run: Path) -> None:
    """Undo ``pack_run``: the archive's files back in place, each ``.json.xz`` back to its ``.json``."""
    archive = run / ARCHIVE
    if archive.is_file():
        with tarfile.open(archive) as tar:
            for m in tar.getmembers():
                target = (run / m.name).resolve()
                if run.resolve() not in target.parents or not m.isfile():
                    raise SystemExit(f"{archive}: refusing member {m.name!r} outside the run")
                handle = tar.extractfile(m)
                assert handle is not None
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(handle.read())
        archive.unlink()
    for path in sorted(run.rglob("*.json.xz")):
        path.with_name(path.name.removesuffix(".xz")).write_bytes(lzma.decompress(path.read_bytes()))
        path.unlink()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", type=Path, metavar="RUN")
    ap.add_argument("--unpack", action="store_true", help="restore the files a run wrote")
    ap.add_argument("--thin", action="store_true", help="round packed per-request records (lossy)")
    ap.add_argument("--drop-records", action="store_true", help="drop packed per-request records (lossy)")
    ap.add_argument(
        "--max-json-kb", type=int, default=MAX_JSON_KB, help="larger per-phase JSON is compressed"
    )
    a = ap.parse_args(argv)
    for run in a.runs:
        if not run.is_dir():
            raise SystemExit(f"{run}: not a directory")
        if a.thin or a.drop_records:
            thin_run(run, drop=a.drop_records)
        else:
            unpack_run(run) if a.unpack else pack_run(run, a.max_json_kb)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
