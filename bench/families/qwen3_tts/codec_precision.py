"""bf16 against fp32 for the Qwen3-TTS 12 Hz codec decoder: the evidence behind the served precision.

Decodes the same codes with the same weights in fp32 and in bf16 (the quantizer's codebooks stay fp32 in both,
as the loader keeps them; Snake runs in fp32 inside either), streamed in the serving chunk schedule's 25-frame
steady chunks, and reports the bf16 output's error against fp32: max abs, relative RMS, SNR in dB and cosine.
Two sources: the golden fixtures' decoder (the reference checkpoint layout, tiny) and size-true random
weights (the 0.6B / 1.7B codec, the same decoder). Random codes, fixed seed.

Usage: ``python -m bench.families.qwen3_tts.codec_precision --out codec_precision.json [--device cuda]
[--frames 100]``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch

from services.codec.models.qwen3_tts.decoder import Qwen3TokenizerDecoder
from services.codec.models.qwen3_tts.loader import random_init
from services.codec.models.qwen3_tts.presets import decoder_preset
from services.codec.models.qwen3_tts.streaming import StreamingDecoder

CHUNK = 25  # the deploy file's steady codec chunk


def streamed(model: Qwen3TokenizerDecoder, codes: torch.Tensor) -> torch.Tensor:
    dec = StreamingDecoder(model, max_streams=codes.shape[0])
    slots = torch.arange(codes.shape[0], device=codes.device)
    with torch.inference_mode():
        parts = [dec.decode(codes[..., i : i + CHUNK], slots) for i in range(0, codes.shape[-1], CHUNK)]
    return torch.cat(parts, -1).float()


def error(test: torch.Tensor, ref: torch.Tensor) -> dict[str, float]:
    diff = test - ref
    rms_ref = ref.pow(2).mean().sqrt().item()
    rms_diff = diff.pow(2).mean().sqrt().item()
    return {
        "max_abs": diff.abs().max().item(),
        "rel_rms": rms_diff / rms_ref,
        "snr_db": 20 * float(np.log10(rms_ref / max(rms_diff, 1e-30))),
        "cosine": torch.nn.functional.cosine_similarity(test.flatten(), ref.flatten(), dim=0).item(),
        "ref_rms": rms_ref,
    }


def compare(name: str, fp32: Qwen3TokenizerDecoder, bf16: Qwen3TokenizerDecoder, codes: torch.Tensor) -> dict:
    t0 = time.perf_counter()
    ref, test = streamed(fp32, codes), streamed(bf16, codes)
    rec = {"source": name, "streams": codes.shape[0], "frames": codes.shape[-1], **error(test, ref)}
    rec["seconds"] = round(time.perf_counter() - t0, 1)
    print(f"{name:>12}: rel RMS {rec['rel_rms']:.4f}  SNR {rec['snr_db']:.1f} dB  max {rec['max_abs']:.4f}"
          f"  cosine {rec['cosine']:.5f}  ({rec['seconds']} s)", flush=True)  # fmt: skip
    return rec


def codes_for(model: Qwen3TokenizerDecoder, streams: int, frames: int, device: str) -> torch.Tensor:
    cfg = model.config
    g = torch.Generator().manual_seed(0)
    codes = torch.randint(0, cfg.codebook_size, (streams, cfg.num_quantizers, frames), generator=g)
    return codes.to(device)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--frames", type=int, default=100)
    ap.add_argument("--streams", type=int, default=2)
    ap.add_argument("--sources", default="golden,size-true")
    a = ap.parse_args(argv)
    records = []
    for source in a.sources.split(","):
        if source == "golden":
            import tempfile

            from services.codec.models.qwen3_tts.loader import load_qwen3_tts_decoder
            from tests.golden import materialize_checkpoint  # the dev checkout's fixtures

            with tempfile.TemporaryDirectory() as tmp:
                ckpt = materialize_checkpoint("custom_voice", Path(tmp))
                fp32 = load_qwen3_tts_decoder(ckpt, device=a.device)
                bf16 = load_qwen3_tts_decoder(ckpt, device=a.device, dtype=torch.bfloat16)
        elif source == "size-true":
            fp32 = random_init(decoder_preset("qwen3-tts-0.6b"), seed=0, device=a.device)
            bf16 = random_init(
                decoder_preset("qwen3-tts-0.6b"), seed=0, device=a.device, dtype=torch.bfloat16
            )
        else:
            raise SystemExit(f"unknown source {source!r}")
        records.append(compare(source, fp32, bf16, codes_for(fp32, a.streams, a.frames, a.device)))
    meta = {"device": a.device, "torch": torch.__version__, "records": records}
    Path(a.out).write_text(json.dumps(meta, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
