"""Where a voice clone's first audio goes, against a built-in voice (issue 30), with the engines alone.

Served on the H200, a voice-library voice's time to first audio was 32.1 ms p50 against 27.1 ms for a built-in
voice (docs/benchmarks.md), and the gateway's own histogram saw the same gap, so it lies in the stages. This
runs one request at a time through the talker and codec engines in one process, built as the stages build
them (the deploy file's engine settings, the codec's ``build_engine`` with its voice-state cache), and splits
each request's first audio:

* ``submit_ms``: ``TalkerEngine.submit``, which builds the prompt (``adapter.prepare``);
* ``first_frame_ms``: from the submit to the talker's first frame (admission, prefill, one frame step);
* ``codec_open_ms``: ``CodecEngine.open`` (a clone restores its voice's decoder state there);
* ``first_pcm_ms``: from the first frame pushed to the codec's first PCM.

Arms: ``builtin`` (a CustomVoice preset and its bench voice), ``clone`` (the Base preset, a 10 s
reference's codes, x-vector and transcript, as a voice-library voice reaches the stages: the codec gets the
codes as its prefix under a voice key) and ``xvector`` (the Base preset with the x-vector alone: what a voice
uploaded without a transcript becomes). For each arm one request is also profiled (host-to-device copies,
synchronizations, top ops), its prompt build alone by host time (``prompt_profile``), and one request with
a device sync after each part (``phases``: kernels and device time of the codec's open, the submit, the
talker's steps to the first frame, the codec's to the first PCM), which says on which side, and in which
kernels, a clone's extra time goes.

    python bench/families/qwen3_tts/voice_ttfa.py --out voice_ttfa.json
    python bench/families/qwen3_tts/voice_ttfa.py --out voice_ttfa.json --device cpu --size tiny --requests 2
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import statistics
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bench.codec_schedule import warm_up as warm_up_codec
from bench.kernel_stats import phase, phase_stats, profile_call
from services.codec.engine import CodecEngine
from services.codec.main import build_engine
from services.codec.models import load_codec
from services.talker.engine import EngineConfig, TalkerEngine, TalkerRequest
from services.talker.models import load_talker
from services.talker.sampling import SamplingParams
from services.talker.spec import SpeechSpec
from voxstage import families
from voxstage.config.cli_args import load_from_args
from voxstage.presets import resolve_model

ROOT = Path(__file__).resolve().parents[3]
TEXT = "The quick brown fox jumps over the lazy dog while the orchestra tunes up."
REF_TEXT = "This is the reference recording of the voice, spoken clearly for ten seconds or so."
SAMPLING = SamplingParams(do_sample=True, temperature=0.9, top_k=50, repetition_penalty=1.05)
log = logging.getLogger("bench.voice_ttfa")


class Pair:
    """A talker engine and a codec engine of one preset, driven one request at a time."""

    def __init__(self, a: argparse.Namespace, model: str) -> None:
        config = load_from_args(a.config, a)
        self.device = a.device
        stage = config.talker
        adapter, _ = load_talker(resolve_model(model), device=a.device, dtype=a.talker_dtype)
        if a.device == "cuda" and not stage.enforce_eager:
            adapter.enable_cuda_graphs()
        self.talker = TalkerEngine(
            adapter,
            EngineConfig(
                max_num_seqs=stage.max_num_seqs,
                max_model_len=min(stage.max_model_len or 4096, 4096),
                max_num_batched_tokens=stage.batched_token_budget,
                enable_prefix_caching=stage.enable_prefix_caching,
                async_scheduling=stage.async_scheduling,
            ),
        )
        self.hidden = adapter.model.hidden_size
        runtime = load_codec(
            resolve_model(model), device=a.device, dtype=a.codec_dtype, max_streams=config.codec.max_num_seqs
        )
        self.codec: CodecEngine = build_engine(config, runtime, a.device)
        self.groups, self.codebook = runtime.num_groups, runtime.codebook_size
        self.codec_warm_s = warm_up_codec(runtime, self.codec)
        self.n = 0

    def sync(self) -> None:
        if self.device == "cuda":
            torch.cuda.synchronize()

    def request(
        self, spec: SpeechSpec, frames: int, prefix: np.ndarray | None, key: str, phased: bool = False
    ) -> dict[str, float]:
        """One request, served order: the codec opens first, then the talker's submit; times in ms. With
        ``phased`` each part runs in a profiler range (``kernel_stats.phase``) and ends with a device sync, so
        a profile of the call splits its device work by part (the times then include the syncs)."""
        self.n += 1
        rid = f"r{self.n}"
        self.sync()

        @contextlib.contextmanager
        def part(name: str) -> Iterator[None]:
            if not phased:
                yield
                return
            with phase(name):
                yield
                self.sync()

        t0 = time.perf_counter()
        with part("codec_open"):
            self.codec.open(rid, prefix=prefix, prefix_key=key)
        t_open = time.perf_counter()
        req = TalkerRequest(rid, spec, seed=self.n, sampling=SAMPLING, subtalker=SAMPLING,
                            max_frames=frames, min_frames=frames)  # fmt: skip
        with part("submit"):
            self.talker.submit(req)
        t_submit = time.perf_counter()
        t_frame = t_pcm = None
        done = False
        while not done:
            with part("talker_to_first_frame" if t_frame is None else "rest"):
                outs = self.talker.step()
            with part("codec_to_first_pcm" if t_pcm is None else "rest"):
                for o in outs:
                    if o.codes.shape[0]:
                        t_frame = t_frame or time.perf_counter()
                        self.codec.push(rid, o.codes)
                    if o.finish is not None:
                        self.codec.finish(rid)
                for c in self.codec.step():
                    if c.pcm.size and t_pcm is None:
                        t_pcm = time.perf_counter()
                    done = done or c.final
        assert t_frame is not None and t_pcm is not None, "the request produced no audio"
        return {
            "codec_open_ms": 1e3 * (t_open - t0),
            "submit_ms": 1e3 * (t_submit - t_open),
            "first_frame_ms": 1e3 * (t_frame - t_open),
            "first_pcm_ms": 1e3 * (t_pcm - t_frame),
            "ttfa_ms": 1e3 * (t_pcm - t0),
        }


def phased_profile(
    pair: Pair, spec: SpeechSpec, frames: int, prefix: np.ndarray | None, key: str
) -> dict[str, dict[str, Any]]:
    """One request with a sync after each part, profiled: kernels and device time per part."""
    acts = [torch.profiler.ProfilerActivity.CPU]
    if pair.device == "cuda":
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=acts) as prof:
        pair.request(spec, frames, prefix, key, phased=True)
    return phase_stats(prof, pair.device == "cuda")


PARTS = ("prepare", "_admit", "_prefill", "_decode")


def timed_parts(
    pair: Pair, spec: SpeechSpec, frames: int, prefix: np.ndarray | None, key: str, n: int
) -> dict[str, float]:
    """``n`` requests with the talker's parts timed one by one, each behind a device sync: ``host`` ms is the
    call's own time (launches and Python), ``synced`` ms adds the wait for its device work. The parts of the
    step that prefills and the first frame step (the first ``_decode`` that returns a frame) are what a clone
    adds to; medians over the requests."""
    engine, adapter = pair.talker, pair.talker.adapter
    rows: list[dict[str, float]] = []
    cur: dict[str, float] = {}

    def wrap(obj: Any, name: str) -> Any:
        fn = getattr(obj, name)

        def timed(*args: Any, **kw: Any) -> Any:
            pair.sync()
            t0 = time.perf_counter()
            out = fn(*args, **kw)
            t1 = time.perf_counter()
            pair.sync()
            t2 = time.perf_counter()
            if f"{name}_host_ms" not in cur and (name != "_decode" or out):
                cur[f"{name}_host_ms"], cur[f"{name}_synced_ms"] = 1e3 * (t1 - t0), 1e3 * (t2 - t0)
            return out

        setattr(obj, name, timed)
        return fn

    saved = [
        (obj, name, wrap(obj, name))
        for obj, name in ((adapter, "prepare"), *((engine, p) for p in PARTS[1:]))
    ]
    try:
        for _ in range(n):
            cur = {}
            pair.request(spec, frames, prefix, key)
            rows.append(cur)
    finally:
        for obj, name, fn in saved:
            setattr(obj, name, fn)
    keys = sorted({k for r in rows for k in r})
    return {k: round(statistics.median(r[k] for r in rows if k in r), 4) for k in keys}


def summary(rows: list[dict[str, float]]) -> dict[str, dict[str, float]]:
    return {
        k: {
            "median": round(statistics.median(r[k] for r in rows), 3),
            "min": round(min(r[k] for r in rows), 3),
        }
        for k in rows[0]
    }


def run_arm(a: argparse.Namespace, arm: str, model: str) -> dict[str, Any]:
    pair = Pair(a, model)
    rng = np.random.default_rng(0)
    prefix, key = None, ""
    if arm == "builtin":
        fam = families.preset(model)
        voice = fam[0].bench.voice if fam is not None and fam[0].bench is not None else None
        spec = SpeechSpec(text=TEXT, voice=voice, language="english")
    elif arm == "xvector":  # an x-vector alone: no transcript, no reference codes
        xvec = rng.standard_normal(pair.hidden).astype(np.float32)
        spec = SpeechSpec(text=TEXT, language="english", speaker_embedding=xvec)
    else:
        frames = round(a.clip_seconds * 12.5)
        prefix = rng.integers(0, pair.codebook, (frames, pair.groups), dtype=np.int64)
        xvec = rng.standard_normal(pair.hidden).astype(np.float32)
        spec = SpeechSpec(text=TEXT, language="english", speaker_embedding=xvec, ref_text=REF_TEXT,
                          ref_codes=prefix)  # fmt: skip
        key = "voice_bench@1"
    for _ in range(a.warmup):  # graphs of every shape these requests meet; the voice's decoder state
        pair.request(spec, a.frames, prefix, key)
    rows = [pair.request(spec, a.frames, prefix, key) for _ in range(a.requests)]
    prof = profile_call(lambda: pair.request(spec, a.frames, prefix, key), a.device)
    adapter = pair.talker.adapter
    prompt_prof = profile_call(lambda: adapter.prepare(spec), a.device, top=25, host=True)
    out_phases = phased_profile(pair, spec, a.frames, prefix, key)
    parts = timed_parts(pair, spec, a.frames, prefix, key, max(3, a.requests // 2))
    out = {"arm": arm, "model": model, "codec_warm_up_s": round(pair.codec_warm_s, 2), **summary(rows)}
    states = pair.codec.voice_states
    out["codec_voice_states"] = None if states is None else len(states)  # 1: the clone's state was reused
    out["requests"] = rows
    out["profile"] = prof
    out["prompt_profile"] = prompt_prof  # the prompt build alone (``submit``'s work), by host time
    out["phases"] = out_phases  # one synced request's device work per part, kernel for kernel
    out["parts"] = parts  # the talker's parts one by one behind syncs (``timed_parts``)
    print(json.dumps({"arm": arm, **{k: v["median"] for k, v in summary(rows).items()}}), flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--size", default="0.6b", help="preset size: 0.6b, 1.7b, tiny")
    ap.add_argument("--config", default=str(ROOT / "deploy" / "qwen3_tts.yaml"), help="deploy file")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--platform", default=None)
    ap.add_argument("--requests", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--frames", type=int, default=50)
    ap.add_argument("--clip-seconds", type=float, default=10.0)
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    if a.device == "cpu":
        torch.set_num_threads(1)
    a.talker_dtype = torch.bfloat16 if a.device == "cuda" else torch.float32
    a.codec_dtype = torch.float32  # the codec stage's default on both devices
    torch.manual_seed(0)
    out: dict[str, Any] = {
        "tool": "bench/families/qwen3_tts/voice_ttfa.py",
        "device": torch.cuda.get_device_name() if a.device == "cuda" else "cpu",
        "torch": torch.__version__,
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "frames": a.frames,
        "clip_seconds": a.clip_seconds,
        "arms": [],
    }
    # No inference_mode around the engines: the codec's warm-up runs on its own engine thread, as served, and
    # must update the pool that loading made; the engines enter it themselves where they compute.
    base = f"qwen3-tts-{a.size}-base"
    for arm, model in (("builtin", f"qwen3-tts-{a.size}"), ("clone", base), ("xvector", base)):
        out["arms"].append(run_arm(a, arm, model))
        if a.device == "cuda":
            torch.cuda.empty_cache()
    b, c, x = out["arms"]
    for name, arm in (("clone", c), ("xvector", x)):
        out[f"{name}_minus_builtin_ms"] = {
            k: round(arm[k]["median"] - b[k]["median"], 3) for k in summary(b["requests"])
        }
    a.out.write_text(json.dumps(out, indent=1) + "\n")
    for name, arm in (("clone", c), ("xvector", x)):
        out[f"{name}_minus_builtin_parts_ms"] = {
            k: round(v - b["parts"][k], 4) for k, v in arm["parts"].items() if k in b["parts"]
        }
    keys = [f"{n}_minus_builtin{s}" for n in ("clone", "xvector") for s in ("_ms", "_parts_ms")]
    print(json.dumps({k: out[k] for k in keys}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
