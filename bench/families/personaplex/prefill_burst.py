"""A join burst's prompt prefill on one GPU (issue 27): what one ``prefill_many`` call of B sessions costs.

On the H200, 64 sessions joining at once heard their first agent audio 0.59 s (p50) after connecting with the
seed's 512-position prefill budget and 2048 alike, and 1.06 s, all together, when one 4096-position call took
every prompt at once (docs/benchmarks.md). This times the talker's batched prefill alone, as the duplex engine
calls it: B sessions of the size-true preset, each prompt built the serving way (a stored voice, a persona),
all at offset 0 for the whole prompt (``PersonaPlexAdapter.prefill_many``), host-timed with a sync per call.
Split per call: ``rows`` (the prompts' input embeddings, ``_prompt_rows``) and ``transformer`` (the Helium
prefill over the rings). Arms:

* ``served``: the prompt as the adapter serves it (a stored voice's rows kept on the device since the H200
  profile of this bench counted 130 synchronizing copies in a 64-session call);
* ``host_voice``: the same rows in host memory, copied per session as before that change;
* ``graphed``: ``served`` with the whole prompts replayed from CUDA graphs (``PrefillGraphs``: padded to a
  length bucket, up to 8 prompts a replay, captured before timing); on CPU the same padded path, eager.

For the largest B a torch.profiler table (top device kernels; host-to-device copies and synchronizations
counted) says where the time goes.

    python bench/families/personaplex/prefill_burst.py --out burst.json [--batches 1,8,16,32,64]
    python bench/families/personaplex/prefill_burst.py --out burst.json --device cpu --size tiny --batches 1,2
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from collections.abc import Callable
from typing import Any

import torch

from bench.families.personaplex.personaplex_gpu import Bench, add_model_args
from bench.kernel_stats import profile_call
from services.talker.models.personaplex.adapter import PersonaPlexAdapter
from services.talker.models.personaplex.config import parse_lm_config
from services.talker.models.personaplex.loader import random_init
from services.talker.models.personaplex.presets import PRESET_VOICES, preset_config, voice_codes
from services.talker.models.personaplex.prompt import Prompt
from services.talker.models.personaplex.tokenizer import PersonaTokenizer, tiny_tokenizer_model
from services.talker.models.personaplex.voices import VoiceLibrary, voice_from_codes

PERSONA = "You enjoy having a good conversation."  # the realtime load client's


def build(size: str, device: str, slots: int, window: int) -> PersonaPlexAdapter:
    """The adapter as the talker loads a size-true preset: random weights, seeded stored voices."""
    config = parse_lm_config(preset_config(f"personaplex-{size}"))
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    model = random_init(config, seed=0, device=device, dtype=dtype)
    voices = {name: voice_from_codes(model, voice_codes(name)) for name in PRESET_VOICES}
    adapter = PersonaPlexAdapter(
        model, PersonaTokenizer(tiny_tokenizer_model()), VoiceLibrary.of(voices, source=size)
    )
    adapter.allocate(slots, min(window, config.context))
    return adapter


def burst(adapter: PersonaPlexAdapter, prompt: Prompt, b: int) -> dict[str, Callable[[], object]]:
    """One call's work for slots ``[0, b)``, whole prompts at offset 0, and its two parts."""
    n = prompt.length - 1
    chunks = [(slot, prompt, 0, n) for slot in range(b)]
    slots = list(range(b))

    def rows() -> torch.Tensor:
        return adapter._prompt_rows([prompt] * b, 0, n)  # noqa: SLF001 - the part being timed

    x = rows()
    return {
        "call": lambda: adapter.prefill_many(chunks),
        "rows": rows,
        "transformer": lambda: adapter.model.transformer.prefill(x, slots, 0, adapter.kv),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    batches = [int(x) for x in args.batches.split(",")]
    adapter = build(args.size, args.device, max(batches), args.window)
    bench = Bench(args.device, args.iters)
    stored = adapter.prepare(persona=PERSONA, voice=PRESET_VOICES[0])
    assert stored.embeddings is not None
    on_host = dataclasses.replace(stored, embeddings=stored.embeddings.to("cpu", torch.float32))
    out: dict[str, Any] = {
        "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
        "torch": torch.__version__,
        "size": args.size,
        "prompt_positions": stored.length - 1,
        "voice_rows": stored.num_embedded,
        "results": [],
    }
    for arm, prompt in (("served", stored), ("host_voice", on_host), ("graphed", stored)):
        if arm == "graphed":
            if args.device == "cuda":
                adapter.enable_cuda_graphs()
            else:
                adapter.pad_prefill()
            assert adapter.prefill_graphs is not None
            out["prefill_graphs_captured"] = adapter.prefill_graphs.capture_all()
        for b in batches:
            row: dict[str, Any] = {"arm": arm, "batch": b, "positions": b * (prompt.length - 1)}
            for name, fn in burst(adapter, prompt, b).items():
                row[name] = bench.timed(fn)
            out["results"].append(row)
            print(
                json.dumps({k: (v["median_ms"] if isinstance(v, dict) else v) for k, v in row.items()}),
                flush=True,
            )
        out[f"profile_{arm}"] = profile_call(burst(adapter, prompt, max(batches))["call"], args.device)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_model_args(parser, batches="1,8,16,32,64", iters=10)
    args = parser.parse_args()
    torch.manual_seed(0)
    with torch.inference_mode():
        result = run(args)
    args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
