"""Write a preset's weights as a real-layout Qwen3-TTS checkpoint, for the reference implementation to load.

    python bench/families/qwen3_tts/export_reference_weights.py --model qwen3-tts-0.6b --out /tmp/ref-0.6b \
        [--device cuda]

Size-true presets carry no weights on disk: each stage draws them on its device at start-up
(``voxstage.presets``). This script draws them exactly as the stages do (same seed, device and dtype:
talker bf16 and codec fp32 on CUDA, fp32 on CPU) and writes ``model.safetensors`` (``talker.*``) and
``speech_tokenizer/model.safetensors`` (``decoder.*``) next to the preset's config files, so
``bench/families/qwen3_tts/reference_qwen_tts.py`` times the reference with the very weights our stack serves.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

from services.codec.models.qwen3_tts import loader as codec_loader
from services.talker.models.qwen3_tts.loader import (
    load_qwen3_tts_talker,
    random_init,
    read_config,
    talker_checkpoint_state,
)
from voxstage.presets import resolve_model

CONFIG_FILES = ("config.json", "generation_config.json")
TOKENIZER_FILES = ("config.json", "preprocessor_config.json")


def export(model: str, out: Path, device: str) -> dict[str, object]:
    source = resolve_model(model)
    talker_dtype = torch.bfloat16 if device == "cuda" else torch.float32  # the talker stage's default
    codec_dtype = torch.float32  # the codec stage's default on every device
    out.mkdir(parents=True, exist_ok=True)
    (out / "speech_tokenizer").mkdir(exist_ok=True)
    for name in CONFIG_FILES:
        shutil.copyfile(source.path / name, out / name)
    for name in TOKENIZER_FILES:
        shutil.copyfile(source.path / "speech_tokenizer" / name, out / "speech_tokenizer" / name)
    t0 = time.perf_counter()
    with torch.no_grad():
        if source.random_init:
            talker = random_init(
                read_config(source.path), seed=source.seed, device=device, dtype=talker_dtype
            )
        else:
            talker, _, _ = load_qwen3_tts_talker(source.path, device=device, dtype=talker_dtype)
        state = {k: v.to("cpu") for k, v in talker_checkpoint_state(talker).items()}
        talker_params = sum(v.numel() for v in state.values())
        save_file(state, str(out / "model.safetensors"))
        del talker, state
        if source.random_init:
            decoder = codec_loader.random_init(
                codec_loader.load_decoder_config(source.path), source.seed, device=device, dtype=codec_dtype
            )
        else:
            decoder = codec_loader.load_qwen3_tts_decoder(source.path, device=device, dtype=codec_dtype)
        dstate = {
            codec_loader.DECODER_PREFIX + k: v.to("cpu").contiguous() for k, v in decoder.state_dict().items()
        }
        decoder_params = sum(v.numel() for v in dstate.values())
        save_file(dstate, str(out / "speech_tokenizer" / "model.safetensors"))
    manifest = {
        "model": model,
        "random_init": source.random_init,
        "seed": source.seed,
        "device": device,
        "talker_dtype": str(talker_dtype).removeprefix("torch."),
        "decoder_dtype": str(codec_dtype).removeprefix("torch."),
        "talker_params": talker_params,
        "decoder_params": decoder_params,
        "export_s": time.perf_counter() - t0,
    }
    (out / "voxstage_export.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="preset name or checkpoint directory")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument(
        "--device", choices=("cuda", "cpu"), default="cuda" if torch.cuda.is_available() else "cpu"
    )
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    print(json.dumps(export(args.model, args.out, args.device), indent=1), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
