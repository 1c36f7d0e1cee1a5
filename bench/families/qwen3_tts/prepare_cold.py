"""A talker's prompt preparation hot (back to back) and cold (after an idle pause, as a served request at
1 req/s meets it), built built-in, x-vector clone and in-context clone (issue 30); and back to back with
each text a new length (``varied``).

Served on the H200 at 1 req/s, the talker's ``prepare`` took 2.8-3.8 ms of its engine thread's own CPU time
(``bench/stamp_hook`` with ``VX_PREPARE_OUT``) where a loop of the engine alone measured 0.9-1.3 ms: the
work is the same, the thread runs it after a second asleep. This times ``adapter.prepare`` of one arm's
requests back to back and with ``--pause`` seconds before each, wall clock and the thread's CPU time, at
``--threads`` torch intra-op threads (a CPU op large enough to go parallel wakes the pool's sleeping
threads), and writes medians.

    python bench/families/qwen3_tts/prepare_cold.py --out prepare_cold.json [--device cuda --size 0.6b]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from services.talker.models import load_talker
from services.talker.spec import SpeechSpec
from voxstage.presets import resolve_model

REF_TEXT = "The quick brown fox jumps over the lazy dog, and then it runs away into the forest."


def arms(
    size: str, device: str, dtype: torch.dtype = torch.float32
) -> dict[str, tuple[Any, Callable[[str], SpeechSpec]]]:
    builtin, _ = load_talker(resolve_model(f"qwen3-tts-{size}"), device=device, dtype=dtype)
    base, _ = load_talker(resolve_model(f"qwen3-tts-{size}-base"), device=device, dtype=dtype)
    model = base.model
    rng = np.random.default_rng(0)
    xvec = rng.standard_normal(model.hidden_size).astype(np.float32)
    codes = rng.integers(0, 64, (125, model.num_code_groups), dtype=np.int64)  # 10 s of reference
    voice = sorted(builtin.model.config.talker.spk_id)[0]
    return {
        "builtin": (builtin, lambda t: SpeechSpec(text=t, voice=voice, text_complete=True)),
        "xvector": (base, lambda t: SpeechSpec(text=t, speaker_embedding=xvec, text_complete=True)),
        "icl": (
            base,
            lambda t: SpeechSpec(
                text=t, speaker_embedding=xvec, ref_text=REF_TEXT, ref_codes=codes, text_complete=True
            ),
        ),
    }


def timed(adapter: Any, spec: SpeechSpec, device: str) -> tuple[float, float]:
    t0, c0 = time.perf_counter(), time.thread_time()
    adapter.prepare(spec)
    out = 1e3 * (time.perf_counter() - t0), 1e3 * (time.thread_time() - c0)
    if device == "cuda":
        torch.cuda.synchronize()  # the next call starts from an idle device either way
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--size", default="tiny")
    ap.add_argument("--requests", type=int, default=30)
    ap.add_argument("--pause", type=float, default=0.2, help="seconds idle before each cold call")
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--dtype", default=None, help="default: bfloat16 on cuda (as served), float32 on cpu")
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    dtype = getattr(torch, a.dtype or ("bfloat16" if a.device == "cuda" else "float32"))
    out: dict[str, Any] = {"tool": "bench.families.qwen3_tts.prepare_cold", "date": time.strftime("%F %T"),
                           "device": a.device, "size": a.size, "threads": a.threads, "pause_s": a.pause,
                           "dtype": str(dtype), "arms": {}}  # fmt: skip
    for name, (adapter, make) in arms(a.size, a.device, dtype).items():
        texts = iter(f"Hello there, this is request number {i} of the test." for i in range(10_000))
        for _ in range(5):
            timed(adapter, make(next(texts)), a.device)
        hot = [timed(adapter, make(next(texts)), a.device) for _ in range(a.requests)]
        # Back to back again, each text a length not met before (served texts vary; the hot ones above
        # are all one length): a per-shape cost of the prompt's GEMMs shows here and not above.
        varied = [timed(adapter, make(" ".join(["word"] * (40 + i))), a.device) for i in range(a.requests)]
        cold = []
        for _ in range(a.requests):
            time.sleep(a.pause)
            cold.append(timed(adapter, make(next(texts)), a.device))
        out["arms"][name] = {
            f"{kind}_{what}_ms": round(statistics.median(x[i] for x in runs), 3)
            for kind, runs in (("hot", hot), ("varied", varied), ("cold", cold))
            for i, what in enumerate(("wall", "cpu"))
        }
        print(name, out["arms"][name])
    a.out.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
