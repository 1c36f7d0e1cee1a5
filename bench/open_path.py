"""How long a text-to-speech request's first text takes from the gateway's ``open`` to the talker (issue 28).

Starts a real stack (``voxstage serve``, the default family's tiny preset on CPU unless told otherwise) with
``bench/stamp_hook`` first on every process's ``PYTHONPATH``, which stamps points on one clock; this reads
two: the gateway writing a request's ``open`` to the codec, and the talker taking that request's first
text. Then sends ``--requests`` whole-text requests through the OpenAI-compatible HTTP face, one at a time,
and writes the distribution of the interval (the first ``--warmup`` dropped). Before the text rode in the open
(docs/protocol.md §2) it waited for the stages' ``opened`` round trip.

    python -m bench.open_path --out open_path.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import urllib.request
from pathlib import Path

from bench import stamps
from bench.stack import Stack, StackSpec
from voxstage import families

TEXT = "Hello there, this is a test of latency."


def intervals(log: str) -> list[float]:
    """ms from each ``gateway.open`` stamp to the next ``talker.text`` stamp, in time order."""
    stamps = sorted(
        (float(parts[1]), parts[3]) for line in log.splitlines() if (parts := line.split())[:1] == ["STAMP"]
    )
    out, opened = [], None
    for t, point in stamps:
        if point == "gateway.open":
            opened = t
        elif point == "talker.text" and opened is not None:
            out.append(1e3 * (t - opened))
            opened = None
    return out


def speak(http: str, model: str, voice: str | None) -> None:
    body = {"model": model, "input": TEXT, "response_format": "pcm", "stream": True}
    if voice:
        body["voice"] = voice
    req = urllib.request.Request(
        f"http://{http}/v1/audio/speech", json.dumps(body).encode(), {"content-type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=120) as r:
        r.read()


def main(argv: list[str] | None = None) -> int:
    fam = families.default_family()
    assert fam.demo is not None
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--model", default=fam.demo[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--voice", default=fam.bench.voice if fam.bench is not None else None)
    ap.add_argument("--requests", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=2)
    a = ap.parse_args(argv)
    log = a.out.with_suffix(".stack.log")
    stack = Stack(StackSpec(model=a.model, device=a.device, frames=None), log, env=stamps.env())
    if not stack.start():
        raise SystemExit(f"the stack did not start; see {log}")
    try:
        for _ in range(a.requests):
            speak(stack.http, a.model, a.voice)
            time.sleep(0.3)
    finally:
        stack.stop()
    ms = intervals(log.read_text(errors="replace"))[a.warmup :]
    if not ms:
        raise SystemExit(f"no stamps in {log}: was the hook on the stack's PYTHONPATH?")
    doc = {
        "tool": "bench.open_path", "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "model": a.model,
        "device": a.device, "requests": len(ms), "open_to_talker_text_ms": ms,
        "median_ms": statistics.median(ms), "min_ms": min(ms), "max_ms": max(ms),
    }  # fmt: skip
    a.out.write_text(json.dumps(doc, indent=1))
    print(f"open written -> first text at the talker: median {doc['median_ms']:.2f} ms "
          f"(min {doc['min_ms']:.2f}, max {doc['max_ms']:.2f}, n={len(ms)})")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
