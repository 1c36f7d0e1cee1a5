"""Operator count and CPU wall time of one Mimi streaming step (one 80 ms frame per row), real size.

Two device-independent proxies for kernels per call, from the CPU profiler: ``ops``, the ATen ops the call
dispatches directly, and ``kernels``, the ATen ops that run a kernel of their own (views, allocations,
composite wrappers and host-side checks left out; a hidden copy, such as a ``layer_norm`` making its input
contiguous, counts as one more). Runs the slot-indexed API (``slots = arange(B)``) and, where the codec has
it, the packed one.

    .venv/bin/python bench/families/personaplex/mimi_step_ops.py --batches 1,8 --iters 5
"""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter
from collections.abc import Callable

import torch
from torch.autograd.profiler_util import FunctionEvent
from torch.profiler import ProfilerActivity, profile

from services.codec.models.mimi.loader import random_init
from services.codec.models.mimi.presets import full_config
from services.codec.models.mimi.streaming import MimiStreamingCodec

# Ops that only make a new tensor header (or an uninitialised buffer): no kernel on a device.
VIEW_OPS = {
    "aten::view",
    "aten::_unsafe_view",
    "aten::reshape",
    "aten::slice",
    "aten::select",
    "aten::narrow",
    "aten::permute",
    "aten::transpose",
    "aten::t",
    "aten::unsqueeze",
    "aten::squeeze",
    "aten::expand",
    "aten::expand_as",
    "aten::as_strided",
    "aten::unflatten",
    "aten::flatten",
    "aten::unbind",
    "aten::split",
    "aten::alias",
    "aten::detach",
    "aten::empty",
    "aten::empty_strided",
    "aten::view_as_real",
    "aten::view_as_complex",
    "aten::lift_fresh",
    "aten::chunk",
    "aten::split_with_sizes",
    "aten::_reshape_alias",
    "aten::resolve_conj",
    "aten::resolve_neg",
    "aten::result_type",
    "aten::view_as",
    "aten::empty_like",
    "aten::new_empty",
    "aten::resize_",
    "aten::is_same_size",
    "aten::_shape_as_tensor",
    "aten::as_strided_",
    "aten::scalar_tensor",
    "aten::mT",
    "aten::detach_",
}
# Composite ops: all their device work is done by the ATen ops they call (counted there).
COMPOSITE_OPS = {
    "aten::conv1d",
    "aten::conv_transpose1d",
    "aten::convolution",
    "aten::_convolution",
    "aten::cdist",
    "aten::_euclidean_dist",
    "aten::to",
    "aten::_to_copy",
    "aten::clone",
    "aten::contiguous",
    "aten::embedding",
    "aten::full",
    "aten::layer_norm",
    "aten::linear",
    "aten::matmul",
    "aten::ones_like",
    "aten::zeros_like",
    "aten::scaled_dot_product_attention",
    "aten::stack",
    "aten::masked_fill",
    "aten::thnn_conv2d",
    "aten::__and__",
}
# Backend kernels counted as one kernel each, whatever CPU-specific helpers they call inside.
OPAQUE_OPS = {
    "aten::mkldnn_convolution",
    "aten::_slow_conv2d_forward",
    "aten::slow_conv_transpose2d",
    "aten::_scaled_dot_product_flash_attention_for_cpu",
}
# Host-side work: CPU-only input checks and the wrapping of Python scalars inside an op.
HOST_OPS = {
    "aten::_local_scalar_dense",
    "aten::item",
    "aten::is_nonzero",
    "aten::min",
    "aten::max",
    "aten::_nnpack_available",
}


def _aten_parent(ev: FunctionEvent) -> FunctionEvent | None:
    parent = ev.cpu_parent
    while parent is not None and not parent.name.startswith("aten::"):
        parent = parent.cpu_parent
    return parent


def _is_kernel(ev: FunctionEvent) -> bool:
    name = ev.name
    if name in VIEW_OPS or name in COMPOSITE_OPS or name in HOST_OPS:
        return False
    if any(child.name == name for child in ev.cpu_children):  # a wrapper around its own overload
        return False
    parent = _aten_parent(ev)
    while parent is not None:
        if parent.name in OPAQUE_OPS or parent.name in HOST_OPS:
            return False
        if parent.name == "aten::to" and _aten_parent(parent) is not None:  # a scalar cast inside an op
            return False
        parent = _aten_parent(parent)
    return True


def count_ops(fn: Callable[[], object]) -> tuple[Counter[str], Counter[str]]:
    """(ATen ops ``fn`` calls directly, ATen ops that run a kernel of their own) for one call."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    top: Counter[str] = Counter()
    kernels: Counter[str] = Counter()
    for ev in prof.events():
        if not ev.name.startswith("aten::"):
            continue
        if _aten_parent(ev) is None:
            top[ev.name] += 1
        if _is_kernel(ev):
            kernels[ev.name] += 1
    return top, kernels


def summarize(fn: Callable[[], object]) -> dict[str, object]:
    top, leaves = count_ops(fn)
    return {"ops": sum(top.values()), "kernels": sum(leaves.values()), "top": leaves.most_common(10)}


def wall_ms(fn: Callable[[], object], iters: int) -> float:
    fn()
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return sorted(times)[len(times) // 2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: leave as is)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    model = random_init(full_config(), seed=0)
    for b in (int(x) for x in args.batches.split(",")):
        codec = MimiStreamingCodec(model, max_streams=max(b, 1))
        gen = torch.Generator().manual_seed(b)
        pcm = torch.randn(b, codec.samples_per_frame, generator=gen) * 0.1
        codes = torch.randint(0, codec.codebook_size, (b, codec.num_codebooks, 1), generator=gen)
        slots = torch.arange(b)
        calls: dict[str, Callable[[], object]] = {
            "encode[slots]": lambda: codec.encode(pcm, slots),  # noqa: B023
            "decode[slots]": lambda: codec.decode(codes, slots),  # noqa: B023
        }
        if hasattr(codec, "encode_packed"):
            calls["encode[packed]"] = lambda: codec.encode_packed(pcm)  # noqa: B023
            calls["decode[packed]"] = lambda: codec.decode_packed(codes)  # noqa: B023
        for name, fn in calls.items():
            fn()  # past the first frame: the replicate pad and caches take their steady path
            row = {"batch": b, "call": name, **summarize(fn), "wall_ms": wall_ms(fn, args.iters)}
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
