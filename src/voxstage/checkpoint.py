"""Strict checkpoint loading shared by every model family.

A checkpoint that does not match the module tree must fail loudly, naming the keys, never load
half-silently: a missing key would otherwise keep its random init and produce plausible-looking noise.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import TypeVar

import torch
from safetensors.torch import load_file
from torch import nn

# Re-exported: the loaders import both from here.
from voxstage.checkpoint_json import CheckpointError as CheckpointError
from voxstage.checkpoint_json import read_json as read_json


def read_safetensors(path: Path, device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
    if not path.is_file():
        raise CheckpointError(f"missing weights file {path}")
    return load_file(str(path), device=str(device))


def _preview(keys: Iterable[str], limit: int = 12) -> str:
    keys = sorted(keys)
    shown = ", ".join(keys[:limit])
    return shown + (f", ... ({len(keys) - limit} more)" if len(keys) > limit else "")


def load_state_dict_strict(
    module: nn.Module,
    state: Mapping[str, torch.Tensor],
    *,
    source: str,
    ignore: Iterable[str] = (),
    assign: bool = False,
) -> None:
    """Copy ``state`` into ``module``; any missing, unexpected or mis-shaped key raises ``CheckpointError``.

    ``ignore`` lists checkpoint keys that are known to carry nothing the module needs (buffers the
    reference recomputes, say); they are dropped before the comparison. ``assign`` makes the module take the
    checkpoint's tensors (cast to the module's dtypes) instead of copying into its own: a module built on the
    ``meta`` device then never holds a second copy of a multi-GB checkpoint.
    """
    ignored = set(ignore)
    state = {k: v for k, v in state.items() if k not in ignored}
    expected = module.state_dict()
    missing = expected.keys() - state.keys()
    unexpected = state.keys() - expected.keys()
    problems = []
    if missing:
        problems.append(f"missing keys: {_preview(missing)}")
    if unexpected:
        problems.append(f"unexpected keys: {_preview(unexpected)}")
    shapes = [
        f"{k}: checkpoint {tuple(state[k].shape)} vs model {tuple(v.shape)}"
        for k, v in expected.items()
        if k in state and tuple(state[k].shape) != tuple(v.shape)
    ]
    if shapes:
        problems.append("shape mismatches: " + "; ".join(shapes[:8]))
    if problems:
        raise CheckpointError(f"{source} does not match the model: " + " | ".join(problems))
    if assign:
        module.load_state_dict({k: state[k].to(dtype=v.dtype) for k, v in expected.items()}, assign=True)
        return
    with torch.no_grad():
        for k, v in expected.items():
            v.copy_(state[k].to(dtype=v.dtype))


M = TypeVar("M", bound=nn.Module)


@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype) -> Iterator[None]:
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def build_module(make: Callable[[], M], device: torch.device | str, dtype: torch.dtype) -> M:
    """``make()`` with its parameters created directly on ``device`` in ``dtype`` (no transient fp32 copy of
    a multi-GB model; ``meta`` builds without memory), in eval mode without gradients."""
    if not dtype.is_floating_point:
        raise ValueError(f"dtype must be a floating point type, got {dtype}")
    with _default_dtype(dtype), torch.device(device):
        module = make()
    return module.eval().requires_grad_(False)
