"""A real peer process for the shared-memory tests (run as a script, never imported by pytest).

shm_peer.py writer SIZE COUNT   creates a writer, lends COUNT payloads of SIZE bytes and prints one JSON
                                line {"probe", "prefix", "refs": [...], "sha256": [...]}; then waits on
                                stdin: "close" closes the writer explicitly, EOF just exits (the finalizer
                                must clean up), and SIGKILL leaves the files for the survivor to reap.
shm_peer.py reader              reads JSON refs from stdin, one per line, and answers each with
                                {"sha256": ...} (or {"error": ...}) without acking: the parent decides.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import sys

from voxstage.transport.shm import ShmReader, ShmRef, ShmWriter, StaleShmReference


def _writer(size: int, count: int) -> None:
    writer = ShmWriter(threshold_bytes=1024, region_bytes=1 << 20, max_total_bytes=16 << 20)
    sender = writer.sender(peer_readable=True)
    payloads = [os.urandom(size) for _ in range(count)]
    refs = [sender.place(p) for p in payloads]
    if not all(isinstance(r, ShmRef) for r in refs):
        raise SystemExit("payloads above the threshold must have gone to shared memory")
    line = {
        "probe": writer.probe_region,
        "prefix": writer.prefix,
        "refs": [dataclasses.asdict(r) for r in refs if isinstance(r, ShmRef)],
        "sha256": [hashlib.sha256(p).hexdigest() for p in payloads],
    }
    print(json.dumps(line), flush=True)
    command = sys.stdin.readline().strip()
    if command == "close":
        writer.close()


def _reader() -> None:
    reader = ShmReader()
    for line in sys.stdin:
        ref = ShmRef(**json.loads(line))
        try:
            answer = {"sha256": hashlib.sha256(reader.read(ref)).hexdigest()}
        except StaleShmReference as exc:
            answer = {"error": str(exc)}
        print(json.dumps(answer), flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "writer":
        _writer(int(sys.argv[2]), int(sys.argv[3]))
    elif sys.argv[1] == "reader":
        _reader()
    else:
        raise SystemExit(f"unknown mode {sys.argv[1]!r}")
