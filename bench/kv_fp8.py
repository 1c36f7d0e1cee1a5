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

Models: the golden fixtures (PersonaPlex ``prompt_voice``, and ``ring_window`` whose 24-frame window wraps;
the Qwen3-TTS CustomVoice checkpoint; fp32), and the size-true random-weight presets ``personaplex-7b`` and
``qwen3-tts-0.6b`` drawn on the device in bf16 (``--size tiny``: the tiny presets). Then the frame step's
time at ``--sessions`` live sessions, model dtype vs fp8, CUDA-graphed on a GPU, with a full 3000-frame ring
(PersonaPlex) or ``--qwen-context`` positions (Qwen3-TTS); a level whose KV does not fit in free device memory
is reported as not fitting.

    python -m bench.kv_fp8 --out kv_fp8.json                                       # H200, ~10 min
    python -m bench.kv_fp8 --out kv_fp8.json --device cpu --size tiny --frames 40 --sessions 1,2
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bench.kv_fp8_families import Driver, PersonaPlexDriver, QwenDriver
from services.talker.models import load_talker
from services.talker.spec import SpeechSpec
from voxstage.nn import kv_fp8
from voxstage.presets import ModelSource, resolve_model

PERSONA = "You are a friendly assistant who answers in short sentences."
TEXTS = (
    "The quick brown fox jumps over the lazy dog, and then it runs far away into the forest.",
    "Streaming speech needs every frame on time, for every session at once.",
    "Memory bounds how many sessions fit; compute bounds how fast each frame runs.",
    "A small cache lets more people talk to the same machine.",
)
METHODS = ("weights", "amax", "unit")


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


# -- models -----------------------------------------------------------------------------------------------
Case = tuple[str, Callable[[str], Driver], Callable[[str], Driver] | None]


def personaplex_case(adapter_for: Callable[[], Any], prompts: list[Any], frames: int, window: int, seed: int):
    """A ``make(kv_cache_dtype)`` over fresh adapters of one model; seeded random user frames."""
    users = np.random.default_rng(seed).integers(0, 2048, size=(frames, len(prompts), 8), dtype=np.int64)

    def make(kv: str) -> Driver:
        adapter = adapter_for()
        adapter.use_kv_cache_dtype(kv)
        return PersonaPlexDriver(adapter, prompts, users, window)

    return make


def golden_personaplex(frames: int, streams: int) -> list[Case]:
    from services.talker.models.personaplex.adapter import PersonaPlexAdapter
    from services.talker.models.personaplex.prompt import build_prompt
    from tests.golden_personaplex import fixture_model, load_case

    out: list[Case] = []
    for name in ("prompt_voice", "ring_window"):
        case = load_case(name)
        fp32, bf16 = (fixture_model(case, dtype) for dtype in (torch.float32, torch.bfloat16))
        prompt = build_prompt(fp32.config, voice_codes=case.get("voice"), text_ids=case["text_ids"])
        window = fp32.config.context
        make, yardstick = (
            personaplex_case(lambda m=m: PersonaPlexAdapter(m), [prompt] * streams, frames, window, 1)
            for m in (fp32, bf16)
        )
        out.append((f"golden/personaplex/{name}", make, yardstick))
    return out


def preset_personaplex(name: str, device: str, dtype: torch.dtype, frames: int, streams: int):
    adapter, info = load_talker(resolve_model(name), device=device, dtype=dtype)
    model, tok, voices = adapter.model, adapter.tokenizer, adapter.voices
    voice = info.voices
    prompts = [adapter.prepare(persona=PERSONA, voice=voice[i % len(voice)]) for i in range(streams)]
    window = min(model.config.context, max(p.length for p in prompts) + frames + 1)
    cls = type(adapter)
    return personaplex_case(lambda: cls(model, tok, voices), prompts, frames, window, 2)


def qwen_case(source: ModelSource, device: str, dtype: torch.dtype, frames: int, streams: int):
    """A ``make(kv_cache_dtype)`` over fresh adapters of one model, one text and voice per stream."""
    adapter, info = load_talker(source, device=device, dtype=dtype)
    voice = info.voices
    specs = [SpeechSpec(text=TEXTS[i % len(TEXTS)], voice=voice[i % len(voice)]) for i in range(streams)]
    cls, model, tok = type(adapter), adapter.model, adapter.tokenizer

    def make(kv: str) -> Driver:
        a = cls(model, tok)
        a.use_kv_cache_dtype(kv)
        prepared = [a.prepare(spec) for spec in specs]
        max_len = max(p.length for p in prepared) + frames + 2
        return QwenDriver(a, prepared, frames, max_len)

    return make


def golden_qwen(frames: int, streams: int, tmp: Path) -> Case:
    from tests import golden

    path = golden.materialize_checkpoint("custom_voice", tmp / "qwen3_golden")
    source = ModelSource("golden", path, "qwen3_tts")
    make, yardstick = (qwen_case(source, "cpu", d, frames, streams) for d in (torch.float32, torch.bfloat16))
    return "golden/qwen3_tts/custom_voice", make, yardstick


# -- frame-step time ------------------------------------------------------------------------------------
def fits(need: int, device: str) -> bool:
    if device != "cuda":
        return True
    # The last level's adapter (its pools and graph memory) must be gone before free memory is read:
    # without the collection a 64-session bf16 ring still held 94 GiB and fp8 at 128 read as not fitting.
    gc.collect()
    torch.cuda.empty_cache()
    free, _ = torch.cuda.mem_get_info()
    return need < 0.9 * free


def timed(step: Callable[[], Any], device: str, iters: int) -> dict[str, float]:
    for _ in range(3):
        step()
    times = []
    for _ in range(iters):
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        step()
        if device == "cuda":
            torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    return {"median_ms": statistics.median(times), "p90_ms": sorted(times)[int(0.9 * (len(times) - 1))]}


def time_personaplex(
    adapter_for: Callable[[], Any], device: str, sessions: list[int], iters: int
) -> list[dict]:
    """The whole frame (``PersonaPlexAdapter.step``) with every ring full (the slowest attention)."""
    out = []
    for kv in ("auto", "fp8"):
        for n in sessions:
            a = adapter_for()
            a.use_kv_cache_dtype(kv)
            window = a.config.context
            need = a.kv_bytes_per_position() * window * n
            row: dict[str, Any] = {"kv_cache_dtype": kv, "sessions": n, "kv_gib": need / 2**30}
            if not fits(need, device):
                out.append(row | {"fits": False})
                continue
            a.allocate(n, window)
            a.state.steps[:n] = window + 5  # every ring wrapped: attention over all 3000 entries
            if device == "cuda":
                a.enable_cuda_graphs()
            row["frame"] = timed(
                lambda a=a, n=n, w=window: a.step([True] * n, w + 5, all_greedy=True), device, iters
            )
            out.append(row | {"fits": True})
            del a
            if device == "cuda":
                torch.cuda.empty_cache()
    return out


def time_qwen(
    source: ModelSource, device: str, dtype: torch.dtype, sessions: list[int], context: int, iters: int
):
    """The whole frame (``Qwen3TTSAdapter.decode``: talker step + code predictor) at ``context`` positions."""
    base, _ = load_talker(source, device=device, dtype=dtype)
    out = []
    for kv in ("auto", "fp8"):
        for n in sessions:
            a = type(base)(base.model, base.tokenizer)
            a.use_kv_cache_dtype(kv)
            need = a.kv_bytes_per_token() * (context + 1) * n
            row: dict[str, Any] = {
                "kv_cache_dtype": kv,
                "sessions": n,
                "context": context,
                "kv_gib": need / 2**30,
            }
            if not fits(need, device):
                out.append(row | {"fits": False})
                continue
            a.allocate(n, context + 1)
            a.positions[:n].fill_(context - 1)
            if device == "cuda":
                a.enable_cuda_graphs()

            def step(a: Any = a, n: int = n) -> None:
                a.positions[:n].fill_(context - 1)  # the same context every frame
                a.decode([True] * n, context)

            row["frame"] = timed(step, device, iters)
            out.append(row | {"fits": True})
            del a
            if device == "cuda":
                torch.cuda.empty_cache()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--size", default="true", choices=("true", "tiny"))
    p.add_argument("--frames", type=int, default=200)
    p.add_argument("--streams", type=int, default=4, help="sessions per error run")
    p.add_argument("--scales", default=",".join(METHODS))
    p.add_argument("--sessions", default="1,64,128", help="frame-step timing levels")
    p.add_argument("--qwen-context", type=int, default=1024)
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
    pp_name = "personaplex-7b" if args.size == "true" else "personaplex-tiny"
    qwen_name = "qwen3-tts-0.6b" if args.size == "true" else "qwen3-tts-tiny"
    result: dict[str, Any] = {"device": args.device, "dtype": str(dtype), "frames": args.frames, "errors": []}
    if args.device == "cuda":
        result["gpu"] = torch.cuda.get_device_name()
    started = time.perf_counter()
    with torch.inference_mode(), tempfile.TemporaryDirectory() as tmp:
        cases: list[Case] = []
        if "golden" not in skip:
            cases += golden_personaplex(args.frames, args.streams)
            cases.append(golden_qwen(args.frames, args.streams, Path(tmp)))
        if "true" not in skip:
            pp = preset_personaplex(pp_name, args.device, dtype, args.frames, args.streams)
            qwen = qwen_case(resolve_model(qwen_name), args.device, dtype, args.frames, args.streams)
            cases += [(pp_name, pp, None), (qwen_name, qwen, None)]
        for name, make, yardstick in cases:
            result["errors"].append(measure(name, make, args.frames, methods, yardstick))
            print(f"{name}: {time.perf_counter() - started:.0f} s", flush=True)
        if "timing" not in skip:
            adapter, _ = load_talker(resolve_model(pp_name), device=args.device, dtype=dtype)
            model, tok, voices = adapter.model, adapter.tokenizer, adapter.voices
            make_pp = lambda: type(adapter)(model, tok, voices)  # noqa: E731
            result["timing"] = {
                pp_name: time_personaplex(make_pp, args.device, sessions, args.iters),
                qwen_name: time_qwen(
                    resolve_model(qwen_name), args.device, dtype, sessions, args.qwen_context, args.iters
                ),
            }
            del adapter, model
    result["seconds"] = time.perf_counter() - started
    args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
