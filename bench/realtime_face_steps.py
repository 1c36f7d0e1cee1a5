"""What each step of a realtime session-tick costs the gateway, one call at a time (issue 27): the record
behind the choices in docs/benchmarks.md, "The gateway's WebSocket face per session".

Process-wide numbers (``bench/realtime_face.py``) move by ±10 % between runs on a shared machine; a step
timed alone in CPU time (``time.process_time``, best of five) does not. Each step runs the serving code on
one 80 ms frame (1,920 samples of 24 kHz pcm16: 3,840 bytes, 5,120 characters of base64), beside what it
replaced or what it could be replaced with:

* out: the audio delta's JSON text (``json.dumps`` of the event dict, as before; ``DeltaText``, as now;
  ``orjson.dumps`` where orjson is importable), agent PCM to pcm16 (``OutputEncoder``);
* in: the append event's JSON parse (``json.loads``; ``orjson.loads`` where importable), its pydantic
  validation, its base64 (``decode_base64`` now; whitespace removal then strict decoding, as before), pcm16
  to frames (``InputDecoder`` + ``Framer``);
* the read of one 5 KB event from a socket, with asyncio's 256 KiB buffer and with the face's 64 KiB one;
* ``asyncio.timeout`` around a send that does not wait (every send's bound, ``gateway.duplex_send``).

    python -m bench.realtime_face_steps --out steps.json
    PYTHONPATH=/tmp/orjson python -m bench.realtime_face_steps --out steps.json   # orjson beside them
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import binascii
import importlib
import json
import subprocess
import sys
import time
import timeit
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from gateway.realtime.events import DeltaText, InputAudioBufferAppendEvent, audio_delta
from gateway.realtime.ws import READ_CHUNK_BYTES
from voxstage.duplex_audio import PCM, Framer, InputDecoder, OutputEncoder, decode_base64

KIND = "response.output_audio.delta"
IDS = ("resp_0123456789abcdef0123", "item_fedcba9876543210fedc")
EVENT_ID = "event_0123456789ab_1234"
ASYNCIO_READ_BYTES = 256 * 1024  # asyncio's selector transports' max_size
_WHITESPACE = str.maketrans("", "", " \t\r\n\f\v")


def per_call_us(fn: Callable[[], object], calls: int) -> float:
    """CPU µs of one call: the best of five rounds of ``calls`` calls."""
    rounds = timeit.repeat(fn, number=calls, repeat=5, timer=time.process_time)
    return 1e6 * min(rounds) / calls


def _frame() -> tuple[bytes, np.ndarray]:
    rng = np.random.default_rng(0)
    pcm16 = (0.1 * rng.standard_normal(1920) * 32767).astype("<i2")
    return pcm16.tobytes(), pcm16.astype(np.float32) / 32768.0


def _old_delta(b64_text: str) -> str:
    event: dict[str, Any] = audio_delta(KIND, IDS, b64_text)
    event["event_id"] = EVENT_ID
    return json.dumps(event)


_READ = """
import socket, sys, time, timeit
a, b = socket.socketpair()
payload, size, calls = b"x" * 5200, int(sys.argv[1]), int(sys.argv[2])
def once():
    a.send(payload)
    b.recv(size)
print(1e6 * min(timeit.repeat(once, number=calls, repeat=5, timer=time.process_time)) / calls)
"""


def _read_us(buffer: int, calls: int) -> float:
    """In a fresh interpreter: glibc moves its mmap threshold up once a large mmapped block is freed, so in
    a process with another allocation history (this one's numpy) a 256 KiB buffer may come from the heap;
    in the gateway it did not (strace: one mmap, mremap and munmap per client event)."""
    done = subprocess.run(
        [sys.executable, "-c", _READ, str(buffer), str(calls)], capture_output=True, check=True
    )
    return float(done.stdout)


def _timeout_us(calls: int) -> float:
    async def measure() -> float:
        async def bounded() -> None:
            async with asyncio.timeout(5.0):
                await asyncio.sleep(0)

        async def bare() -> None:
            await asyncio.sleep(0)

        async def rounds(fn: Callable[[], Any]) -> float:
            best = float("inf")
            for _ in range(5):
                t0 = time.process_time()
                for _ in range(calls):
                    await fn()
                best = min(best, time.process_time() - t0)
            return best

        return 1e6 * (await rounds(bounded) - await rounds(bare)) / calls

    return asyncio.run(measure())


def steps(calls: int = 5000) -> dict[str, Any]:
    """µs of CPU per call of each step (None where its library is not importable)."""
    pcm, f32 = _frame()
    b64_text = base64.b64encode(pcm).decode("ascii")
    append = json.dumps({"type": "input_audio_buffer.append", "audio": b64_text, "event_id": "c1"})
    parsed = json.loads(append)
    deltas = DeltaText(KIND, IDS)
    decoder, framer, encoder = InputDecoder(PCM), Framer(), OutputEncoder(PCM)
    try:
        orjson: Any = importlib.import_module("orjson")
    except ImportError:
        orjson = None
    event: dict[str, Any] = {**audio_delta(KIND, IDS, b64_text), "event_id": EVENT_ID}
    out = {
        "base64 encode of the frame": per_call_us(lambda: binascii.b2a_base64(pcm, newline=False), calls),
        "delta text: json.dumps of the event dict (before)": per_call_us(lambda: _old_delta(b64_text), calls),
        "delta text: DeltaText, base64 included (now)": per_call_us(
            lambda: deltas.base64(pcm, EVENT_ID), calls
        ),
        "delta text: orjson.dumps of the event dict": (
            per_call_us(lambda: orjson.dumps(event), calls) if orjson else None
        ),
        "agent pcm to pcm16 (OutputEncoder)": per_call_us(lambda: encoder.encode(f32), calls),
    }  # fmt: skip
    inn = {
        "json.loads of the append event": per_call_us(lambda: json.loads(append), calls),
        "orjson.loads of the append event": per_call_us(lambda: orjson.loads(append), calls)
        if orjson
        else None,
        "pydantic validation of the event": per_call_us(
            lambda: InputAudioBufferAppendEvent.model_validate(parsed), calls
        ),
        "base64: whitespace removed, then strict (before)": per_call_us(
            lambda: binascii.a2b_base64(b64_text.translate(_WHITESPACE).encode("ascii"), strict_mode=True),
            calls,
        ),
        "base64: decode_base64 (now)": per_call_us(lambda: decode_base64(b64_text), calls),
        "pcm16 to 80 ms frames (InputDecoder + Framer)": per_call_us(
            lambda: framer.push(decoder.decode(pcm)), calls
        ),
    }
    io = {
        f"read of a 5 KB event, {ASYNCIO_READ_BYTES // 1024} KiB buffer (asyncio's, before)": _read_us(
            ASYNCIO_READ_BYTES, calls
        ),
        f"read of a 5 KB event, {READ_CHUNK_BYTES // 1024} KiB buffer (now)": _read_us(
            READ_CHUNK_BYTES, calls
        ),
        "asyncio.timeout around a send that does not wait": _timeout_us(calls),
    }
    return {
        "unit": "CPU µs per call, best of 5 rounds",
        "calls_per_round": calls,
        "orjson": getattr(orjson, "__version__", None),
        "python": sys.version.split()[0],
        "out": out,
        "in": inn,
        "io": io,
    }


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--calls", type=int, default=5000, help="calls per round")
    args = p.parse_args(argv)
    result = {"tool": "bench.realtime_face_steps", **steps(args.calls)}
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
