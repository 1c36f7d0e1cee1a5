"""``codec.pth`` in and out: the reference's loading rules, weight-norm folding, the released layout.

Reading (models.md §2.5): ``torch.load(weights_only=True)``; a ``state_dict`` entry, if present, holds the
weights; if any key starts with ``generator.`` only those are kept, prefix stripped (a training checkpoint
also carries ``discriminator.*``); ``*freqs_cis`` / ``*causal_mask`` buffers are dropped (recomputed);
weight norm is folded into plain ``weight`` for both forms the file uses:

* ``X.parametrizations.weight.original0`` (g) / ``.original1`` (v): ``torch.nn.utils.parametrizations``,
  every encoder/decoder conv;
* ``X.weight_g`` / ``X.weight_v``: legacy ``torch.nn.utils.weight_norm``, the VQ ``in_proj``/``out_proj``.

Both use ``dim=0``: ``weight = v * g / ||v||`` with the norm over every axis but the first (for a transposed
conv, whose weight is ``[in, out, k]``, that is per input channel).

Writing (:func:`released_layout`) inverts this for tests and tiny presets: parametrization form for
``encoder.*``/``decoder.*`` convs, legacy form for the VQ projections, plain weights elsewhere (the
quantizer's re-sampler convs, transformers, norms), stand-in ``freqs_cis``/``causal_mask`` buffers, all
under ``generator.`` inside ``{"state_dict": ...}``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from voxstage.checkpoint import CheckpointError

PARAM_G, PARAM_V = ".parametrizations.weight.original0", ".parametrizations.weight.original1"
LEGACY_G, LEGACY_V = ".weight_g", ".weight_v"
DROPPED_SUFFIXES = ("freqs_cis", "causal_mask")
PREFIX = "generator."
_VQ_PROJ = re.compile(
    r"^quantizer\.(semantic_quantizer|quantizer)\.quantizers\.\d+\.(in_proj|out_proj)\.weight$"
)
_WN_CONV = re.compile(r"^(encoder|decoder)\..*\.conv\.weight$")


def read_codec_state(path: Path) -> dict[str, torch.Tensor]:
    """The weights of ``codec.pth`` at ``path`` under this package's module names (weight norm folded)."""
    if not path.is_file():
        raise CheckpointError(f"missing codec weights {path}")
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any unpickling failure means the same thing here
        raise CheckpointError(f"{path} is not a readable torch checkpoint: {exc}") from exc
    return normalize_state(obj, source=str(path))


def normalize_state(obj: Any, *, source: str) -> dict[str, torch.Tensor]:
    """Apply the reference's unwrapping rules to a loaded ``codec.pth`` object, then fold weight norm."""
    if isinstance(obj, Mapping) and "state_dict" in obj:
        obj = obj["state_dict"]
    if not isinstance(obj, Mapping):
        raise CheckpointError(f"{source} must hold a state dict, got {type(obj).__name__}")
    state = dict(obj)
    if any(k.startswith(PREFIX) for k in state):
        state = {k[len(PREFIX) :]: v for k, v in state.items() if k.startswith(PREFIX)}
    state = {k: v for k, v in state.items() if not k.endswith(DROPPED_SUFFIXES)}
    bad = [k for k, v in state.items() if not isinstance(v, torch.Tensor)]
    if bad:
        raise CheckpointError(f"{source}: entries that are not tensors: {', '.join(sorted(bad)[:8])}")
    return fold_weight_norm(state, source=source)


def fold_weight_norm(state: Mapping[str, torch.Tensor], *, source: str) -> dict[str, torch.Tensor]:
    """Replace every (g, v) pair, in either form, by ``<module>.weight``."""
    out: dict[str, torch.Tensor] = {}
    pairs: dict[str, dict[str, torch.Tensor]] = {}
    for key, value in state.items():
        for g_suffix, v_suffix in ((PARAM_G, PARAM_V), (LEGACY_G, LEGACY_V)):
            if key.endswith(g_suffix):
                pairs.setdefault(key[: -len(g_suffix)], {})["g"] = value
                break
            if key.endswith(v_suffix):
                pairs.setdefault(key[: -len(v_suffix)], {})["v"] = value
                break
        else:
            out[key] = value
    for base, parts in pairs.items():
        if set(parts) != {"g", "v"}:
            missing = "magnitude (g)" if "g" not in parts else "direction (v)"
            raise CheckpointError(f"{source}: weight-norm pair of {base!r} lacks its {missing} tensor")
        if f"{base}.weight" in out:
            raise CheckpointError(f"{source}: {base!r} has both a plain and a weight-normed weight")
        out[f"{base}.weight"] = _fold(parts["g"], parts["v"], f"{source}: {base}")
    return out


def _fold(g: torch.Tensor, v: torch.Tensor, where: str) -> torch.Tensor:
    v32 = v.float()
    norm = v32.flatten(1).norm(dim=1).view(-1, *([1] * (v.dim() - 1)))
    if g.numel() != norm.numel():
        raise CheckpointError(
            f"{where}: weight-norm magnitude has {g.numel()} entries, expected {norm.numel()} "
            f"(one per row of the {tuple(v.shape)} direction)"
        )
    return (v32 * (g.float().reshape(norm.shape) / norm)).to(v.dtype)


def _split(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A (g, v) pair that folds back to ``weight``. v is the weight scaled by a row-dependent factor (1, 2
    or 3), so a loader that skipped the fold, or normed over the wrong axis, would visibly get it wrong."""
    w = weight.detach().float()
    rows = w.shape[0]
    scale = (1 + torch.arange(rows, device=w.device) % 3).float().view(-1, *([1] * (w.dim() - 1)))
    g = w.flatten(1).norm(dim=1).view(-1, *([1] * (w.dim() - 1)))
    return g, w * scale


def released_layout(
    state: Mapping[str, torch.Tensor], transformers: Mapping[str, tuple[int, int]]
) -> dict[str, Any]:
    """Our state dict -> the object ``codec.pth`` holds. ``transformers`` maps each transformer's module path
    to (head_dim, window), for its stand-in ``freqs_cis`` [2 * window, head_dim / 2, 2] (bf16, as the
    reference builds it) and ``causal_mask`` [2 * window, 2 * window] buffers, which loading drops."""
    out: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        value = value.detach().to("cpu", torch.float32).contiguous()
        base = key[: -len(".weight")]
        if _VQ_PROJ.match(key):
            out[base + LEGACY_G], out[base + LEGACY_V] = _split(value)
        elif _WN_CONV.match(key):
            out[base + PARAM_G], out[base + PARAM_V] = _split(value)
        else:
            out[key] = value.clone()
    for path, (head_dim, window) in transformers.items():
        n = 2 * window
        angles = torch.outer(
            torch.arange(n).float(), 1.0 / 10000.0 ** (torch.arange(0, head_dim, 2) / head_dim)
        )
        out[f"{path}.freqs_cis"] = torch.stack([angles.cos(), angles.sin()], dim=-1).to(torch.bfloat16)
        out[f"{path}.causal_mask"] = torch.ones(n, n, dtype=torch.bool).tril()
    return {"state_dict": {PREFIX + k: v for k, v in out.items()}}
