"""Drivers of ``bench/kv_fp8.py``: one serving adapter per family, stepped greedily frame by frame, with the
logits of each head captured and the next frame's input forcible (teacher forcing).

Both drivers run the stage's own adapter (``use_kv_cache_dtype``, ``allocate``, prefill, the frame step);
the only additions are forward hooks on the output heads and the teacher-forcing writes between frames.

* PersonaPlex: heads are the text head and the 8 depformer heads. Forcing uses the frame step's own forced-
  token path, so every head of the fp8 run is conditioned on the reference's tokens.
* Qwen3-TTS: the head is the talker's ``codec_head`` (c0; the code predictor's 15 heads follow the sampled
  c0 inside a frame, so only c0 is compared teacher-forced). Forcing writes the reference's next input
  embedding; sampling is greedy without repetition penalty, so no other slot state differs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from services.talker.sampling import SamplingParams

GREEDY = SamplingParams(do_sample=False)


class Capture:
    """Forward hooks that keep the outputs of ``modules`` (by name) during one frame."""

    def __init__(self, modules: dict[str, torch.nn.Module]) -> None:
        self.out: dict[str, torch.Tensor] = {}
        self._hooks = [m.register_forward_hook(self._keep(name)) for name, m in modules.items()]

    def _keep(self, name: str) -> Any:
        def hook(module: torch.nn.Module, args: Any, output: torch.Tensor) -> None:
            self.out[name] = output.detach().float().clone()

        return hook

    def take(self) -> dict[str, torch.Tensor]:
        out, self.out = self.out, {}
        return out

    def close(self) -> None:
        for h in self._hooks:
            h.remove()


class Driver:
    adapter: Any
    n: int
    capture: Capture

    def end(self) -> int:
        raise NotImplementedError

    def filled(self) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of the streams' slots, positions written so far ``[layers, n, heads, positions, hd]``."""
        kv, end = self.adapter.kv, self.end()
        return kv.k[:, : self.n, :, :end], kv.v[:, : self.n, :, :end]


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


class QwenDriver(Driver):
    """``streams`` requests over one Qwen3-TTS adapter, each held open for ``frames`` frames."""

    family = "qwen3_tts"

    def __init__(self, adapter: Any, prepared: Sequence[Any], frames: int, max_len: int) -> None:
        self.adapter, self.prepared, self.frames = adapter, prepared, frames
        self.n = len(prepared)
        adapter.allocate(self.n, max_len)

    def start(self) -> None:
        a = self.adapter
        plain = SamplingParams(do_sample=False, repetition_penalty=1.0)
        for slot, p in enumerate(self.prepared):
            a.admit(slot, p, seed=slot, sampling=plain, subtalker=plain, min_frames=self.frames + 1)
            a.append_text(slot, 0, list(p.trailing_ids), True)
        a.prefill_many([(slot, p, 0, p.length - 1) for slot, p in enumerate(self.prepared)])
        for slot, p in enumerate(self.prepared):
            a.start_decode(slot, p)
        self.capture = Capture({"c0": a.model.codec_head})

    def end(self) -> int:
        return int(self.adapter.positions[: self.n].max())

    def step(self, forced: torch.Tensor | None = None) -> tuple[np.ndarray, dict[str, torch.Tensor]]:
        """One frame; ``forced [n, hidden]`` replaces the next input it made (the reference's)."""
        codes, _ = self.adapter.decode([True] * self.n, int(self.adapter.positions[: self.n].max()) + 1)
        logits = self.capture.take()
        logits["next_input"] = self.adapter.next_input[: self.n].clone()
        if forced is not None:
            self.adapter.next_input[: self.n] = forced
        return codes.copy(), logits
