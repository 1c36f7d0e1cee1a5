"""What ``bench/kv_fp8.py`` and the families' drivers share. A family with an fp8 KV cache names its module
in its descriptor (``Bench.kv_fp8``, under its bench folder); that module drives one serving adapter of the
family, stepped greedily frame by frame, with the logits of each head captured and the next frame's input
forcible (teacher forcing). Each driver runs the stage's own adapter (``use_kv_cache_dtype``, ``allocate``,
prefill, the frame step); the only additions are forward hooks on the output heads and the teacher-forcing
writes between frames.

A family's module provides:

* ``PRESETS``: ``{"true": size-true preset, "tiny": tiny preset}`` (``--size``);
* ``golden_cases(frames, streams, tmp) -> list[Case]``: its golden fixtures, each with an fp32 ``make`` and a
  bf16 yardstick;
* ``preset_case(name, device, dtype, frames, streams) -> make``;
* ``frame_times(name, device, dtype, sessions, iters, context) -> list[dict]``: the whole frame's time per
  ``kv_cache_dtype`` and session count (``fits`` / ``timed`` below).
"""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable
from typing import Any

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


# (name, make(kv_cache_dtype) -> Driver, the bf16 yardstick's make or None)
Case = tuple[str, Callable[[str], Driver], Callable[[str], Driver] | None]


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
