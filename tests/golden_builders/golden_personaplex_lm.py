"""PersonaPlex LM golden cases from the reference ``moshi`` 0.2.13 ``LMGen`` (runs inside the throwaway venv
made by ``make_golden_personaplex.py``; imports ``moshi``, never ``voxstage``).

The tiny LM (models.md §3.5) gets weights that are a pure function of their names
(``tests/golden_personaplex.py``), loaded into moshi through its own fused-key load hook (the
``model.safetensors`` layout). Each case runs ``LMGen.step`` greedily, one frame at a time:

- the prompt phases, which PyPI moshi lacks, are driven the way NVIDIA's fork forces them: after each
  prompt step the tokens written into the next cache column are overwritten with the forced ones (the
  forced tokens are the last of their step's depformer chain, so overwriting after the step equals forcing
  during it);
- then free-running steps with given user codes (some ``-1``: no input on that codebook).

Recorded per step: the effective input column (moshi's cache column with its initial-token rule applied)
and the 9 tokens the step put in the next column.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[2]
SILENCE_TOKENS = [948, 243, 1178, 546, 1736, 1030, 1978, 2008]
SINE_TOKENS = [430, 1268, 381, 1611, 1095, 1495, 56, 472]
TEXT_PAD = 3
SILENCE_FRAMES = 6


def _golden() -> Any:
    spec = importlib.util.spec_from_file_location(
        "golden_personaplex", REPO / "tests" / "golden_personaplex.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def tiny_lm_kwargs(context: int) -> dict[str, Any]:
    from moshi.models import loaders

    kw = dict(loaders._lm_kwargs)
    kw.update(
        dim=64, num_heads=4, num_layers=2, text_card=200, context=context,
        depformer_dim=32, depformer_num_heads=2, depformer_num_layers=2,
        depformer_dim_feedforward=int(4.125 * 32),
    )  # fmt: skip
    return kw


def fused_shapes(lm: torch.nn.Module) -> dict[str, list[int]]:
    """The checkpoint's key layout: moshi splits ``in_proj_weight`` / ``out_proj.weight`` per step on load
    (``in_projs.N.weight``); the file stores them stacked."""
    shapes: dict[str, list[int]] = {}
    for name, tensor in lm.state_dict().items():
        for split, fused in ((".in_projs.", ".in_proj_weight"), (".out_projs.", ".out_proj.weight")):
            if split in name:
                prefix, rest = name.split(split)
                key = prefix + fused
                n = int(rest.split(".")[0]) + 1
                rows = tensor.shape[0] * n
                shapes[key] = [max(rows, shapes.get(key, [0])[0]), tensor.shape[1]]
                break
        else:
            shapes[name] = list(tensor.shape)
    return shapes


def build_lm(context: int) -> tuple[Any, dict[str, list[int]], dict[str, Any]]:
    from moshi.models.lm import LMModel

    kwargs = tiny_lm_kwargs(context)
    lm = LMModel(device="cpu", dtype=torch.float32, **kwargs).eval()
    shapes = fused_shapes(lm)
    state = _golden().make_state_dict(shapes)
    lm.load_state_dict(state, strict=True)  # through moshi's own load hook: proves the fused layout
    return lm, shapes, kwargs


def prompt_frames(voice: np.ndarray | None, text_ids: list[int]) -> list[tuple[int, list[int], list[int]]]:
    """(text, agent codes, user codes) of every prompt step, in the fork's phase order."""
    frames = [(TEXT_PAD, [int(c) for c in row], SINE_TOKENS) for row in (voice if voice is not None else [])]
    silence = [(TEXT_PAD, SILENCE_TOKENS, SINE_TOKENS)] * SILENCE_FRAMES
    return frames + silence + [(t, SILENCE_TOKENS, SINE_TOKENS) for t in text_ids] + silence


def run_case(
    lm: Any, frames: list[tuple[int, list[int], list[int]]], live_user: np.ndarray
) -> dict[str, np.ndarray]:
    from moshi.models.lm import LMGen

    gen = LMGen(lm, use_sampling=False, temp=0.0, temp_text=0.0)
    delays = np.asarray(lm.delays)
    initial = lm._get_initial_token()[0, :, 0].numpy()
    m = len(frames)
    steps = m - 1 + len(live_user)
    inputs = np.zeros((steps, 17), np.int64)
    made = np.zeros((steps, 9), np.int64)
    users = np.zeros((steps, 8), np.int64)
    with gen.streaming(1):
        state = gen._streaming_state
        ct = state.cache.shape[2]
        for t in range(steps):
            user = frames[t][2] if t < m else live_user[t - m]
            users[t] = user
            gen.step(torch.as_tensor(np.asarray(user, np.int64)).view(1, 8, 1))
            nxt = (t + 1) % ct
            # Forcing: prompt step t makes column t+1, which holds frame t+1's text and codebook 0 and frame
            # t's delayed codebooks; the first free step (t = m-1) still gets frame m-1's delayed ones.
            if t + 1 < m:
                state.cache[0, 0, nxt] = frames[t + 1][0]
                state.cache[0, 1, nxt] = frames[t + 1][1][0]
            if t < m:
                state.cache[0, 2:9, nxt] = torch.as_tensor(frames[t][1][1:])
            col = state.cache[0, :, t % ct].numpy()
            inputs[t] = np.where(t <= delays, initial, col)
            made[t] = state.cache[0, :9, nxt].numpy()
    return {"inputs": inputs, "made": made, "user": users}


def column_embeddings(lm: Any, columns: np.ndarray) -> np.ndarray:
    """moshi's input embedding of token columns: the audio streams in order, then text."""
    tokens = torch.as_tensor(columns).T.unsqueeze(0)  # [1, 17, T]
    with torch.no_grad():
        x = None
        for k in range(lm.num_audio_codebooks):
            e = lm.emb[k](tokens[:, k + 1])
            x = e if x is None else x + e
        x = x + lm.text_emb(tokens[:, 0])
    return x[0].numpy()


def build_lm_fixtures(out_dir: Path, command: str) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(20261201)
    cases: dict[str, Any] = {}
    arrays: dict[str, np.ndarray] = {}

    def live(n: int) -> np.ndarray:
        user = rng.integers(0, 2048, size=(n, 8))
        user[rng.random((n, 8)) < 0.05] = -1  # "no input" on some codebooks
        return user

    # A: voice codes + persona text, long context; B: no voice, a 24-step window that wraps 3 times.
    voice = rng.integers(0, 2048, size=(8, 8))
    text_a = [int(t) for t in rng.integers(4, 200, size=10)]
    text_b = [int(t) for t in rng.integers(4, 200, size=3)]
    specs = {
        "prompt_voice": (3000, voice, text_a, live(60)),
        "ring_window": (24, None, text_b, live(70)),
    }
    for name, (context, voice_codes, text_ids, user) in specs.items():
        lm, shapes, kwargs = build_lm(context)
        frames = prompt_frames(voice_codes, text_ids)
        result = run_case(lm, frames, user)
        meta: dict[str, Any] = {
            "lm_kwargs": {k: v for k, v in kwargs.items()},
            "shapes": shapes,
            "text_ids": text_ids,
            "prompt_frames": len(frames),
            "free_steps": len(user),
            "arrays": sorted(result) + (["voice"] if voice_codes is not None else []),
        }
        if voice_codes is not None:
            arrays[f"{name}.voice"] = np.asarray(voice_codes, np.int64)
            # A stored voice (voices/*.pt) for the same prompt: the embeddings of the voice steps' input
            # columns and the fork's token cache after them (4 columns; column c at index c % 4).
            e = len(voice_codes) - 1
            embeds = column_embeddings(lm, result["inputs"][:e])
            cache = np.full((17, 4), -2, np.int64)
            cache[:, e % 4] = result["inputs"][e]
            after = result["inputs"][e + 1]
            cache[2:9, (e + 1) % 4] = after[2:9]
            cache[10:17, (e + 1) % 4] = after[10:17]
            arrays[f"{name}.voice_embeddings"] = embeds.astype(np.float32)
            arrays[f"{name}.voice_cache"] = cache
            meta["arrays"] += ["voice_cache", "voice_embeddings"]
        for key, value in result.items():
            arrays[f"{name}.{key}"] = value
        cases[name] = meta
    import moshi

    doc = {
        "generator": command,
        "reference": {"moshi": moshi.__version__, "torch": torch.__version__.split("+")[0]},
        "sampling": "greedy (use_sampling=False)",
        "cases": cases,
    }
    (out_dir / "cases.json").write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    with open(out_dir / "cases.npz", "wb") as f:
        np.savez_compressed(f, **dict(sorted(arrays.items())))


if __name__ == "__main__":
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else REPO / "tests" / "fixtures" / "personaplex" / "lm"
    torch.manual_seed(0)
    build_lm_fixtures(out, command="python tests/golden_builders/golden_personaplex_lm.py")
