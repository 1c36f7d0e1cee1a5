"""fp8 KV cache (``kv_cache_dtype: fp8``) against the model-dtype cache (issue 27): error, memory, speed.

Error, per model, for every scale method in ``--scales`` (``weights``: what the talker serves, static per-
head scales bounded from the weights; ``amax``: an oracle, the reference run's own per-layer, per-head
maximum rounded up to a power of two, the best any calibration could do on this input; ``unit``: none):

* ``teacher_forced``: every frame of the fp8 run is fed the reference run's tokens, so the two differ only
  by the cache: logit error (max / mean absolute, mean over the logits' standard deviation) and how often
  the fp8 arg-max equals the reference token, per head;
* ``free_running``: both greedy on their own for ``--frames`` frames: the share of equal tokens and of equal
  frames, and each stream's first differing frame (random-weight logits are near-tied, so this is a
  pessimistic number; the teacher-forced agreement is the per-frame one);
* ``cache``: the reference cache quantized with the method's scales: relative RMS error of K and V, the
  share of values below e4m3's normal range and of values clipped.

Models, for every family whose descriptor names a ``Bench.kv_fp8`` module (under the family's bench folder,
``bench/families/<family>/kv_fp8.py``; ``bench/kv_fp8_kit.py`` says what it provides): the family's golden
fixtures (fp32, beside the same model in bf16 as a yardstick), and its size-true random-weight preset drawn on
the device in bf16 (``--size tiny``: its tiny preset). Then the frame step's time at ``--sessions`` live
sessions, model dtype vs fp8, CUDA-graphed on a GPU, at ``--context`` positions (a TTS family) or with the
full ring (a duplex family); a level whose KV does not fit in free device memory is reported as not fitting.

    python -m bench.kv_fp8 --out kv_fp8.json                                       # H200, ~10 min
    python -m bench.kv_fp8 --out kv_fp8.json --device cpu --size tiny --frames 40 --sessions 1,2
"""

from __future__ import annotations

import argparse
import importlib
import json
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bench.kv_fp8_kit import Case, Driver
from voxstage import families
from voxstage.nn import kv_fp8

METHODS = ("weights", "amax", "unit")


def fp8_families() -> dict[str, Any]:
    """The bench module of every registered family with an fp8 KV cache (its descriptor's ``Bench.kv_fp8``),
    by family name, in registry order."""
    return {
        f.name: importlib.import_module(f.bench.kv_fp8)
        for f in families.families()
        if f.bench and f.bench.kv_fp8
    }


def cache_stats(k: torch.Tensor, v: torch.Tensor, scales: tuple[torch.Tensor, torch.Tensor]) -> dict:
    """The reference cache (written part) stored as fp8 with ``scales [layers, heads]``."""
    out = {}
    for name, x, s in (("k", k.float(), scales[0]), ("v", v.float(), scales[1])):
        scale = s.float().to(x.device)[:, None, :, None, None]
        units = (x / scale).abs()
        back = kv_fp8.dequantize(kv_fp8.quantize(x, scale), scale, torch.float32)
        nonzero = (x != 0).sum().clamp(min=1)
        out[name] = {
            "rel_rms_err": float((back - x).norm() / x.norm().clamp(min=1e-30)),
            "subnormal_share": float(((units < 2.0**-6) & (x != 0)).sum() / nonzero),
            "clipped_share": float((units > kv_fp8.FP8_MAX).sum() / nonzero),
            "max_units": float(units.max()),  # the largest stored magnitude (448: the top of e4m3)
        }
    return out


def oracle_scales(k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    k_scale, v_scale = (kv_fp8.pow2_scale(x.float().abs().amax(dim=(1, 3, 4))) for x in (k, v))
    return k_scale, v_scale


def teacher_forced(ref: list[dict], got: list[dict]) -> dict:
    """Every head's logits against the reference's, and how often their arg-maxes agree."""
    out = {}
    for name in (name for name in ref[0] if name != "next_input"):
        a = torch.stack([r[name] for r in ref]).reshape(len(ref), -1, ref[0][name].shape[-1])
        b = torch.stack([g[name] for g in got]).reshape(a.shape)
        err = (a - b).abs()
        agree = (b.argmax(-1) == a.argmax(-1)).float().mean()
        out[name] = {
            "max_abs": float(err.max()),
            "mean_abs": float(err.mean()),
            "mean_abs_over_std": float(err.mean() / a.std()),
            "argmax_agreement": float(agree),
        }
    return out


def free_running(ref: np.ndarray, got: np.ndarray) -> dict:
    same = ref == got  # [frames, n, columns]
    frames_same = same.all(axis=2)
    first = [int(np.argmin(col)) if not col.all() else len(col) for col in frames_same.T]
    return {
        "token_agreement": float(same.mean()),
        "frame_agreement": float(frames_same.mean()),
        "first_divergence": first,
    }


def measure(
    name: str,
    make: Callable[[str], Driver],
    frames: int,
    methods: list[str],
    yardstick: Callable[[str], Driver] | None = None,
) -> dict:
    """Reference run (``auto``), then per method a teacher-forced and a free-running fp8 run. ``yardstick``
    (fp32 models): the same model in bf16 with its bf16 cache, measured the same way: what serving in bf16
    already costs, against which the fp8 cache's cost can be read."""
    ref = make("auto")
    ref.start()
    steps = [ref.step() for _ in range(frames)]
    tokens = np.stack([t for t, _ in steps])
    logits = [lg for _, lg in steps]
    k, v = ref.filled()
    oracle = oracle_scales(k, v)
    result: dict[str, Any] = {"model": name, "family": ref.family, "frames": frames, "streams": ref.n}
    runs = [(m, make) for m in methods] + ([("bf16_model", yardstick)] if yardstick is not None else [])
    for method, maker in runs:

        def run(method: str = method, maker: Callable[[str], Driver] = maker) -> Driver:
            driver = maker("auto" if method == "bf16_model" else "fp8")
            kv = driver.adapter.kv
            if method == "amax":
                kv.k_scale.copy_(oracle[0])
                kv.v_scale.copy_(oracle[1])
            elif method == "unit":
                kv.k_scale.fill_(1.0)
                kv.v_scale.fill_(1.0)
            driver.start()
            return driver

        forced = run()
        got = []
        for f in range(frames):
            force = logits[f]["next_input"] if "next_input" in logits[f] else tokens[f]
            got.append(forced.step(force)[1])
        scales = (forced.adapter.kv.k_scale, forced.adapter.kv.v_scale)
        forced.capture.close()
        free = run()
        free_tokens = np.stack([free.step()[0] for _ in range(frames)])
        free.capture.close()
        result[method] = {
            "teacher_forced": teacher_forced(logits, got),
            "free_running": free_running(tokens, free_tokens),
        }
        if scales[0] is not None:
            result[method]["cache"] = cache_stats(k, v, scales)
    ref.capture.close()
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--size", default="true", choices=("true", "tiny"))
    p.add_argument("--frames", type=int, default=200)
    p.add_argument("--streams", type=int, default=4, help="sessions per error run")
    p.add_argument("--scales", default=",".join(METHODS))
    p.add_argument("--sessions", default="1,64,128", help="frame-step timing levels")
    p.add_argument(
        "--context", "--qwen-context", type=int, default=1024,
        help="positions of a TTS family's timed frame (a duplex family times its full ring)",
    )  # fmt: skip
    p.add_argument("--iters", type=int, default=30)
    p.add_argument("--skip", default="", help="comma list of parts to skip: golden,true,timing")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (tiny models: 1)")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    methods = [m for m in args.scales.split(",") if m]
    sessions = [int(n) for n in args.sessions.split(",")]
    skip = set(args.skip.split(","))
    mods = fp8_families()
    result: dict[str, Any] = {"device": args.device, "dtype": str(dtype), "frames": args.frames, "errors": []}
    if args.device == "cuda":
        result["gpu"] = torch.cuda.get_device_name()
    started = time.perf_counter()
    with torch.inference_mode(), tempfile.TemporaryDirectory() as tmp:
        cases: list[Case] = []
        if "golden" not in skip:
            for mod in mods.values():
                cases += mod.golden_cases(args.frames, args.streams, Path(tmp))
        if "true" not in skip:
            for mod in mods.values():
                name = mod.PRESETS[args.size]
                cases.append(
                    (name, mod.preset_case(name, args.device, dtype, args.frames, args.streams), None)
                )
        for name, make, yardstick in cases:
            result["errors"].append(measure(name, make, args.frames, methods, yardstick))
            print(f"{name}: {time.perf_counter() - started:.0f} s", flush=True)
        if "timing" not in skip:
            result["timing"] = {
                mod.PRESETS[args.size]: mod.frame_times(
                    mod.PRESETS[args.size], args.device, dtype, sessions, args.iters, args.context
                )
                for mod in mods.values()
            }
    result["seconds"] = time.perf_counter() - started
    args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
