"""Time the reference ``qwen-tts`` 0.1.1 generation loop at batch 1 (reference-gpu.md §2 methodology).

    PYTHONPATH=/tmp/refenv python3 bench/families/qwen3_tts/reference_qwen_tts.py --weights /tmp/ref-0.6b \
        --out ref.json

Runs in the reference's own environment (qwen-tts 0.1.1 + transformers 4.57.3 in a ``--target`` folder, see
bench/README.md); it never imports voxstage and voxstage never imports it. The weights are the ones our
stack serves, written by ``bench/families/qwen3_tts/export_reference_weights.py`` in the real checkpoint
layout and loaded strictly, so both sides run the same size-true random model.

What is timed, as in reference-gpu.md §2: ``model.generate`` in the form ``generate_custom_voice`` uses
(speaker ryan, English, ``non_streaming_mode=True``, package sampling defaults) on a prompt of 24 random text
ids. ``eos_token_id=2149`` (inside the suppressed special range) makes every call run exactly
``max_new_tokens = frames + 1`` talker steps. A StoppingCriteria injected into the talker's HF ``generate``
takes a cuda-synchronized timestamp after every step: prefill = call start to step 1, first frame = call
start to step 2, per frame = step to step from step 2 on, RTF = generate wall / (frames x 80 ms). One extra
run times each code-predictor ``generate`` (15 codes) on its own. The 12 Hz decoder's ``chunked_decode`` is
timed for 1 and ``frames`` frames, so the package's real first audio (it returns audio only after the whole
``generate`` and one decode) can be stated too.
"""

from __future__ import annotations

import argparse
import importlib.machinery
import json
import statistics
import sys
import time
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[3]
FRAME_S = 0.08
IM_START, IM_END, ASSISTANT, NEWLINE = 151644, 151645, 77091, 198  # Qwen2 tokenizer ids of the chat frame
FIRST_SPECIAL_TEXT_ID = 151643  # random prompt ids stay below the special tokens
EOS_NEVER = 2149  # codec_bos: suppressed during sampling, so generation never stops early
SAMPLING = {  # the package defaults (qwen_tts/inference/qwen3_tts_model.py)
    "do_sample": True,
    "top_k": 50,
    "top_p": 1.0,
    "temperature": 0.9,
    "repetition_penalty": 1.05,
    "subtalker_dosample": True,
    "subtalker_top_k": 50,
    "subtalker_top_p": 1.0,
    "subtalker_temperature": 0.9,
}


def stub_unused() -> None:
    """The golden-fixture generator's stubs (sox, onnxruntime, torchaudio: the 25 Hz tokenizer and demo),
    plus librosa and soundfile, which ``import qwen_tts`` pulls in at module level for the speaker encoder's
    mel filterbank and the wrapper's file I/O, neither used by a CustomVoice ``generate``."""
    sys.path.insert(0, str(REPO / "tests" / "golden_builders"))
    from make_golden_qwen3_tts import stub_unused_modules

    stub_unused_modules()
    for name in ("librosa", "librosa.filters", "soundfile"):
        try:
            __import__(name)
        except ImportError:
            module = types.ModuleType(name)
            module.__spec__ = importlib.machinery.ModuleSpec(name, None)
            if name == "librosa.filters":
                module.mel = _unavailable  # type: ignore[attr-defined]
            sys.modules[name] = module


def _unavailable(*args: object, **kwargs: object) -> None:
    raise RuntimeError("librosa is stubbed in the benchmark environment (speaker encoder not used)")


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def stats_ms(values: list[float]) -> dict[str, float]:
    ms = sorted(1e3 * v for v in values)
    p99 = ms[min(len(ms) - 1, round(0.99 * (len(ms) - 1)))]
    return {"median": statistics.median(ms), "p99": p99, "min": ms[0], "max": ms[-1], "n": len(ms)}


def load_model(weights: Path, device: str) -> Any:
    from qwen_tts.core.models import Qwen3TTSConfig, Qwen3TTSForConditionalGeneration
    from safetensors.torch import load_file

    config = Qwen3TTSConfig.from_pretrained(str(weights))
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    with torch.device(device):
        model = Qwen3TTSForConditionalGeneration._from_config(config, dtype=dtype)
    state = load_file(str(weights / "model.safetensors"), device=device)
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise SystemExit(
            f"weights do not match the reference tree: missing {missing}, unexpected {unexpected}"
        )
    return model.eval()


class Stamps:
    """A StoppingCriteria that never stops, only records a synchronized time after each talker step."""

    def __init__(self, device: str) -> None:
        self.device = device
        self.times: list[float] = []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs: object) -> torch.Tensor:
        sync(self.device)
        self.times.append(time.perf_counter())
        return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)


def wrap(obj: Any, name: str, make: Callable[[Callable[..., Any]], Callable[..., Any]]) -> Callable[[], None]:
    original = getattr(obj, name)
    setattr(obj, name, make(original))
    return lambda: setattr(obj, name, original)


def time_generate(
    model: Any, device: str, frames: int, prompt_ids: int, seed: int, warmup: int, runs: int
) -> dict:
    from transformers import StoppingCriteriaList

    gen = torch.Generator().manual_seed(seed)
    text = torch.randint(0, FIRST_SPECIAL_TEXT_ID, (prompt_ids,), generator=gen).tolist()
    ids = torch.tensor([[IM_START, ASSISTANT, NEWLINE, *text, IM_END, NEWLINE, IM_START, ASSISTANT, NEWLINE]])
    ids = ids.to(device)
    stamps = Stamps(device)

    def with_stamps(original: Callable[..., Any]) -> Callable[..., Any]:
        def generate(*args: Any, **kwargs: Any) -> Any:
            kwargs["stopping_criteria"] = StoppingCriteriaList([stamps])
            return original(*args, **kwargs)

        return generate

    def call() -> tuple[float, list[float], int]:
        stamps.times.clear()
        sync(device)
        t0 = time.perf_counter()
        codes, _ = model.generate(
            input_ids=[ids], instruct_ids=[None], languages=["english"], speakers=["ryan"],
            non_streaming_mode=True, max_new_tokens=frames + 1, eos_token_id=EOS_NEVER, **SAMPLING,
        )  # fmt: skip
        sync(device)
        return time.perf_counter() - t0, [t - t0 for t in stamps.times], int(codes[0].shape[0])

    undo = wrap(model.talker, "generate", with_stamps)
    try:
        torch.manual_seed(seed)
        for _ in range(warmup):
            call()
        if device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        walls, prefill, first, per_frame = [], [], [], []
        for _ in range(runs):
            wall, steps, _ = call()
            if len(steps) != frames + 1:
                raise SystemExit(
                    f"expected {frames + 1} talker steps, saw {len(steps)}: EOS was not disabled"
                )
            walls.append(wall)
            prefill.append(steps[0])
            first.append(steps[1])
            per_frame += [b - a for a, b in zip(steps[1:], steps[2:], strict=False)]
    finally:
        undo()
    cp_times: list[float] = []

    def timed_cp(original: Callable[..., Any]) -> Callable[..., Any]:
        def generate(*args: Any, **kwargs: Any) -> Any:
            sync(device)
            t = time.perf_counter()
            out = original(*args, **kwargs)
            sync(device)
            cp_times.append(time.perf_counter() - t)
            return out

        return generate

    undo = wrap(model.talker.code_predictor, "generate", timed_cp)
    try:
        call()
    finally:
        undo()
    prompt_positions = 3 + 6 + (prompt_ids + 1) + 1  # role, codec tags + speaker, text + tts_eos, codec_bos
    rtfs = [w / (frames * FRAME_S) for w in walls]
    return {
        "frames": frames,
        "talker_steps": frames + 1,
        "prompt_text_ids": prompt_ids,
        "prompt_positions": prompt_positions,
        "warmup_runs": warmup,
        "timed_runs": runs,
        "prefill_ms": stats_ms(prefill),
        "first_frame_ms": stats_ms(first),
        "per_frame_ms": stats_ms(per_frame),
        "cp_15_codes_ms": stats_ms(cp_times),
        "generate_wall_s": {"median": statistics.median(walls), "all": walls},
        "rtf": {"median": statistics.median(rtfs), "min": min(rtfs), "max": max(rtfs), "all": rtfs},
        "peak_gib": torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else None,
    }


def time_decoder(weights: Path, device: str, frames: int, dtypes: list[str], warmup: int, iters: int) -> dict:
    from qwen_tts.core.tokenizer_12hz.configuration_qwen3_tts_tokenizer_v2 import Qwen3TTSTokenizerV2Config
    from qwen_tts.core.tokenizer_12hz.modeling_qwen3_tts_tokenizer_v2 import Qwen3TTSTokenizerV2Decoder
    from safetensors.torch import load_file

    config = Qwen3TTSTokenizerV2Config.from_pretrained(str(weights / "speech_tokenizer"))
    decoder = Qwen3TTSTokenizerV2Decoder(config.decoder_config)
    prefix = "decoder."
    state = {
        k[len(prefix) :]: v
        for k, v in load_file(str(weights / "speech_tokenizer" / "model.safetensors")).items()
    }
    decoder.load_state_dict(state, strict=True)
    out: dict[str, Any] = {"params": sum(p.numel() for p in decoder.parameters())}
    gen = torch.Generator().manual_seed(0)
    for name in dtypes:
        dec = decoder.to(device=device, dtype=getattr(torch, name)).eval()
        for t in sorted({1, frames}):
            codes = torch.randint(0, config.decoder_config.codebook_size, (1, 16, t), generator=gen).to(
                device
            )
            times = []
            with torch.inference_mode():
                for i in range(warmup + iters):
                    sync(device)
                    t0 = time.perf_counter()
                    dec.chunked_decode(codes)
                    sync(device)
                    if i >= warmup:
                        times.append(time.perf_counter() - t0)
            out[f"{name}_t{t}_ms"] = stats_ms(times)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--weights",
        type=Path,
        required=True,
        help="bench/families/qwen3_tts/export_reference_weights.py output",
    )
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--frames", type=int, default=100)
    ap.add_argument("--prompt-ids", type=int, default=24)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--decoder-dtypes", default="bfloat16,float32")
    ap.add_argument("--decoder-iters", type=int, default=50)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    stub_unused()
    import qwen_tts
    import transformers

    report: dict[str, Any] = {
        "reference": "qwen-tts 0.1.1",
        "qwen_tts_file": qwen_tts.__file__,
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
        "date": time.strftime("%Y-%m-%d"),
        "weights": json.loads((args.weights / "voxstage_export.json").read_text()),
    }
    model = load_model(args.weights, args.device)
    report["params"] = sum(p.numel() for p in model.parameters())
    report["attn_implementation"] = {
        "talker": model.talker.config._attn_implementation,
        "code_predictor": model.talker.code_predictor.config._attn_implementation,
    }
    report["generate"] = time_generate(
        model, args.device, args.frames, args.prompt_ids, args.seed, args.warmup, args.runs
    )
    del model
    if args.device == "cuda":
        torch.cuda.empty_cache()
    dtypes = [d for d in args.decoder_dtypes.split(",") if d]
    report["decoder"] = time_decoder(args.weights, args.device, args.frames, dtypes, 10, args.decoder_iters)
    g = report["generate"]
    decode_ms = report["decoder"][f"{dtypes[0]}_t{args.frames}_ms"]["median"]
    # The package streams nothing: its first audio is the whole generate plus one decode of every frame.
    report["first_audio_ms"] = 1e3 * g["generate_wall_s"]["median"] + decode_ms
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps({k: report[k] for k in ("params", "attn_implementation", "first_audio_ms")}, indent=1))
    print(json.dumps({k: g[k] for k in ("first_frame_ms", "per_frame_ms", "rtf")}, indent=1), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
