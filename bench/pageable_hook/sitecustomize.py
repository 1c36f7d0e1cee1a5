"""Loaded by a stack's processes when this folder is first on ``PYTHONPATH`` (``VX_HOOK`` of
``bench/run_gpu.sh``): the codec's text-to-speech tick launch copies its codes, slots and lengths to the
device from pageable memory again, as before ``voxstage.host_copy`` (the copy then waits for the decode in
flight). Diagnostics only, for an A/B of that launch in the paced closed search (issue 28); nothing in the
product imports it.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from typing import Any

import torch

TARGET = "services.codec.engine"


def pageable_to_device(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    return host.to(device, non_blocking=True)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name != TARGET:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module: Any) -> None:
            run(module)
            module.to_device = pageable_to_device
            sys.stderr.write(f"pageable_hook: {TARGET}.to_device copies from pageable memory\n")

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


sys.meta_path.insert(0, _Finder())
