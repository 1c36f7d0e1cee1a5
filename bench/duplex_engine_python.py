"""The duplex codec engine's own Python per session-tick (issue 27): what its engine thread spends, with
the GIL held, around the model on every 80 ms tick of N sessions.

The serving ``DuplexCodecEngine`` (the duplex family's small preset, for its shapes) runs its real tick
and decode burst: every session's user audio pushed (``push_audio``, as the worker's batched commands call
it), the tick gathered and encoded, every session's agent frame pushed (``push_agent``), the burst decoded and
handed out. Only the two batched model calls are replaced by ones that return ready tensors of the right
shape at once, so the CPU time left is the engine's Python and array work, which a GPU does not shorten.
CPU µs per session-tick, best of ``--repeats``; compare two checkouts by running it in each.

    PYTHONPATH=src:. python -m bench.duplex_engine_python --out py.json --sessions 16,64,128
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bench.realtime_face import TINY
from services.codec.duplex.engine import DuplexCodecEngine
from services.codec.duplex.types import AgentFrame, DuplexCodecConfig, UserCodes
from services.codec.models import load_duplex_codec
from voxstage.presets import resolve_model


class ReadyCalls:
    """The engine's two batched calls, answered at once with buffers of the right shape (the model's time
    is the GPU's; what is measured is everything around it)."""

    def __init__(self, codec: Any, max_batch: int, max_frames: int) -> None:
        self.spf = codec.samples_per_frame
        self.codes = torch.zeros(max_batch, codec.num_codebooks, 1, dtype=torch.int64)
        self.wav = torch.zeros(max_batch, max_frames * self.spf)

    def encode(self, pcm: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        return self.codes[: pcm.shape[0]]

    def decode(self, codes: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        return self.wav[: codes.shape[0], : codes.shape[2] * self.spf]


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def measure(sessions: int, ticks: int, repeats: int) -> dict[str, Any]:
    # The duplex family's small preset, loaded as the codec stage loads it (its pool's shapes and state).
    codec = load_duplex_codec(resolve_model(TINY), max_sessions=sessions).codec
    config = DuplexCodecConfig(max_sessions=sessions)
    clock = Clock()
    engine = DuplexCodecEngine(codec, config, calls=ReadyCalls(codec, sessions, 4), clock=clock)
    ids = [f"s{i}" for i in range(sessions)]
    for sid in ids:
        engine.join(sid)
        engine.start(sid)
    spf = engine.spf
    frame = (0.01 * np.random.default_rng(0).standard_normal(spf)).astype(np.float32)
    offsets = dict.fromkeys(ids, 0)
    agent = dict.fromkeys(ids, 0)
    groups = engine.groups

    def one_tick() -> None:
        assert engine._next_tick is not None
        for sid in ids:  # what the worker's batched commands do for one turn of user audio
            engine.push_audio(sid, frame, offsets[sid])
            offsets[sid] += spf
        clock.now = engine._next_tick
        outputs = engine.step()
        for out in outputs:
            if isinstance(out, UserCodes):
                sid = out.session_id
                codes = np.full(groups, agent[sid] % 7, np.int64)
                engine.push_agent(sid, AgentFrame(agent[sid], codes, 3, "", out.index))
                agent[sid] += 1
        heard = engine.step()  # every session answered: the burst is due
        if len(outputs) != sessions or len(heard) != sessions:
            raise RuntimeError(f"{sessions} sessions: {len(outputs)} user codes, {len(heard)} agent frames")

    one_tick()  # the first tick of each session (records, buffers) is not the steady state
    best = float("inf")
    for _ in range(repeats):
        t0 = time.process_time()
        for _ in range(ticks):
            one_tick()
        best = min(best, time.process_time() - t0)
    return {"sessions": sessions, "ticks": ticks, "cpu_us_per_session_tick": 1e6 * best / (ticks * sessions)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--sessions", default="16,64,128")
    ap.add_argument("--ticks", type=int, default=50)
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args()
    torch.set_num_threads(1)
    rows = [measure(int(n), a.ticks, a.repeats) for n in a.sessions.split(",")]
    for row in rows:
        print(json.dumps(row))
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps({"tool": "bench.duplex_engine_python", "levels": rows}, indent=1))


if __name__ == "__main__":
    main()
