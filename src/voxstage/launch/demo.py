"""``voxstage demo``: bring up the whole stack on the built-in tiny model, synthesize, write a WAV, shut down.

It runs exactly what a user would: ``voxstage serve`` (talker, codec and gateway as separate processes),
then the Python SDK against the gateway, then SIGTERM. The built-in model has random weights, so the audio is
structured noise; what the demo shows is the serving path, time to first audio and real-time factor.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from voxstage import families
from voxstage.health_probe import check
from voxstage.placement import free_port

DEFAULT_TEXT = "Hello from voxstage. This sentence travelled from the gateway to the codec and the talker."


def register(subparsers: Any) -> None:
    fam = families.default_family()  # the registry's demo family: its deploy file, tiny preset and a voice
    assert fam.demo is not None
    preset, voice = fam.demo
    p = subparsers.add_parser("demo", help="run the full stack on the built-in tiny model and write audio")
    p.add_argument("--out", default="out/demo.wav", help="output WAV file")
    p.add_argument("--config", default=fam.deploy_file, help="deploy YAML file")
    p.add_argument("--model", default=preset, help="checkpoint directory or preset")
    p.add_argument("--text", default=DEFAULT_TEXT, help="what to say")
    p.add_argument("--voice", default=voice, help=f"a voice of the tiny model ({voice})")
    p.add_argument("--max-frames", type=int, default=120, help="cap on generated frames (random weights)")
    p.add_argument("--start-timeout", type=float, default=300.0, help="seconds the stack may take to start")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    grpc_port = free_port("127.0.0.1")
    http_port = free_port("127.0.0.1", avoid={grpc_port})
    cmd = [
        sys.executable, "-m", "voxstage", "serve", args.config, "--model", args.model,
        "--host", "127.0.0.1", "--grpc-port", str(grpc_port), "--http-port", str(http_port),
    ]  # fmt: skip
    print("starting:", " ".join(cmd[2:]), flush=True)
    stack = subprocess.Popen(cmd, start_new_session=True)
    try:
        deadline = time.monotonic() + args.start_timeout
        addr = f"127.0.0.1:{grpc_port}"
        while not check(addr, timeout=1.0):
            if stack.poll() is not None:
                print(f"voxstage serve exited with {stack.returncode} during start-up", file=sys.stderr)
                return 1
            if time.monotonic() > deadline:
                print("the stack did not become ready in time", file=sys.stderr)
                return 1
            time.sleep(0.5)
        return _synthesize(addr, args)
    finally:
        if stack.poll() is None:
            os.killpg(stack.pid, signal.SIGTERM)
            try:
                stack.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(stack.pid, signal.SIGKILL)
        print(f"stack stopped (exit code {stack.returncode})", flush=True)


def _synthesize(addr: str, args: argparse.Namespace) -> int:
    from voxstage.client import SpeechClient

    with SpeechClient(addr) as client:
        t0 = time.perf_counter()
        audio = client.synthesize_streamed(args.text, voice=args.voice, max_frames=args.max_frames, seed=0)
        wall = time.perf_counter() - t0
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    audio.save(out)
    seconds = audio.duration_s
    print(
        f"wrote {out} ({seconds:.2f} s at {audio.sample_rate} Hz); time to first audio "
        f"{1e3 * audio.time_to_first_audio_s:.0f} ms, real-time factor {wall / max(seconds, 1e-9):.2f} "
        "(CPU, random-weight tiny model)",
        flush=True,
    )
    return 0 if seconds > 0 else 1
