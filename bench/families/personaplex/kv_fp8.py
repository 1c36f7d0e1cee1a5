"""PersonaPlex's part of ``bench/kv_fp8.py`` (its descriptor's ``Bench.kv_fp8``): the golden fixtures
``prompt_voice`` and ``ring_window`` (whose 24-frame window wraps), the presets, and the frame step's time
with every 3000-frame ring full (the slowest attention).

The heads compared are the text head and the 8 depformer heads. Forcing uses the frame step's own forced-
token path, so every head of the fp8 run is conditioned on the reference's tokens.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bench.kv_fp8_kit import GREEDY, Capture, Case, Driver, fits, timed
from services.talker.models import load_talker
from voxstage.presets import resolve_model

PRESETS = {"true": "personaplex-7b", "tiny": "personaplex-tiny"}
PERSONA = "You are a friendly assistant who answers in short sentences."


class PersonaPlexDriver(Driver):
    """``streams`` sessions over one PersonaPlex adapter; user frames are given per step."""

    family = "personaplex"

    def __init__(self, adapter: Any, prompts: Sequence[Any], users: np.ndarray, window: int) -> None:
        self.adapter, self.prompts, self.users = adapter, prompts, users  # users [frames, streams, 8]
        self.n = len(prompts)
        adapter.allocate(self.n, window)
        self.frame = 0

    def start(self) -> None:
        """Prefill every stream's prompt (after ``allocate``: the bench may swap the fp8 scales between)."""
        a = self.adapter
        for slot, prompt in enumerate(self.prompts):
            a.admit(slot, seed=slot, text=GREEDY, audio=GREEDY)
            a.prefill(slot, prompt, 0, prompt.length - 1)
            a.start_decode(slot, prompt)
        model = a.model
        heads = {"text": model.text_linear} | {f"audio{k}": lin for k, lin in enumerate(model.linears)}
        self.capture = Capture(heads)

    def end(self) -> int:
        return min(int(self.adapter.state.steps[: self.n].max()), self.adapter.window)

    def step(self, forced: np.ndarray | None = None) -> tuple[np.ndarray, dict[str, torch.Tensor]]:
        """One frame; ``forced [n, 9]`` (text + agent tokens) replaces what this frame samples. Returns the
        tokens the frame put into the next column and the heads' logits."""
        a, st = self.adapter, self.adapter.state
        if self.frame > 0:
            a.set_user(range(self.n), self.users[self.frame])
        if forced is not None:
            st.forced[: self.n] = torch.as_tensor(forced, device=st.forced.device)
            st.force[: self.n] = True
        a.step([True] * self.n, int(st.steps[: self.n].max()), all_greedy=True)
        self.frame += 1
        return st.column[: self.n, :9].cpu().numpy().copy(), self.capture.take()


def personaplex_case(adapter_for: Callable[[], Any], prompts: list[Any], frames: int, window: int, seed: int):
    """A ``make(kv_cache_dtype)`` over fresh adapters of one model; seeded random user frames."""
    users = np.random.default_rng(seed).integers(0, 2048, size=(frames, len(prompts), 8), dtype=np.int64)

    def make(kv: str) -> Driver:
        adapter = adapter_for()
        adapter.use_kv_cache_dtype(kv)
        return PersonaPlexDriver(adapter, prompts, users, window)

    return make


def golden_cases(frames: int, streams: int, tmp: Path) -> list[Case]:
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


def preset_case(
    name: str, device: str, dtype: torch.dtype, frames: int, streams: int
) -> Callable[[str], Driver]:
    adapter, info = load_talker(resolve_model(name), device=device, dtype=dtype)
    model, tok, voices = adapter.model, adapter.tokenizer, adapter.voices
    voice = info.voices
    prompts = [adapter.prepare(persona=PERSONA, voice=voice[i % len(voice)]) for i in range(streams)]
    window = min(model.config.context, max(p.length for p in prompts) + frames + 1)
    cls = type(adapter)
    return personaplex_case(lambda: cls(model, tok, voices), prompts, frames, window, 2)


def frame_times(
    name: str, device: str, dtype: torch.dtype, sessions: list[int], iters: int, context: int
) -> list[dict]:
    """The whole frame (``PersonaPlexAdapter.step``) with every ring full (the slowest attention; the ring
    is the model's own, so ``context`` is not used)."""
    adapter, _ = load_talker(resolve_model(name), device=device, dtype=dtype)
    model, tok, voices = adapter.model, adapter.tokenizer, adapter.voices
    cls = type(adapter)
    del adapter
    out = []
    for kv in ("auto", "fp8"):
        for n in sessions:
            a = cls(model, tok, voices)
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
