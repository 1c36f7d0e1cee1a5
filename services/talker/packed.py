"""Frame-step plumbing shared by the talker adapters whose step is one graphed ``decode_core(b, attn_len)``
over packed slots, with prompts written by the shared prefill runner (Qwen3-TTS, Audio8-TTS).

``PackedDecodeAdapter`` is a mixin: the family's ``__init__`` sets ``num_groups``, ``device``, ``dtype``,
``min_attn_bucket`` and ``graphs = None``, its ``allocate`` ends with ``allocate_launch``, and it provides
``decode_core`` and ``step_io``. The mixin then launches and collects steps through the pinned ``HostRing``
(``services.talker.launch``) and captures CUDA graphs per (batch, context) decode bucket and per (rows,
length, context) prefill bucket.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from services.talker.adapter import TalkerAdapter
from services.talker.launch import HostRing, Pending, all_inactive, bucket, collect, decode_graph_keys
from services.talker.prefill import KVPoolLike, Prefill, PrefillModel
from voxstage.cudagraphs import GraphCache


class PackedDecodeAdapter(TalkerAdapter):
    num_groups: int
    device: torch.device
    dtype: torch.dtype  # the model's (activations); the KV pool may store fp8
    min_attn_bucket: int
    graphs: GraphCache | None
    # Set by ``allocate_launch``.
    num_slots: int
    max_len: int
    host: HostRing
    prefill_runner: Prefill

    def decode_core(self, b: int, attn_len: int) -> None:
        """The captured unit over slots ``[0, b)``: static shapes for a given (b, attn_len), no host syncs.
        A family with ``variants`` takes their parts as further (defaulted) arguments."""
        raise NotImplementedError

    def variant(self, active: Sequence[bool]) -> tuple[int, ...]:
        """Extra key parts of ``decode_core`` chosen on the host for one step (a family's sampler variant,
        passed after ``(b, attn_len)``); none by default."""
        return ()

    def variants(self) -> list[tuple[int, ...]]:
        """Every value ``variant`` can return (each is a graph of its own per bucket)."""
        return [()]

    def decode_key(self, b: int, length: int, variant: tuple[int, ...]) -> tuple[int, ...] | None:
        """The graph key of a step of batch bucket ``b`` over context bucket ``length`` in ``variant``; a
        family may fold buckets a variant does not read into one, or say None: never launched."""
        return (b, length, *variant)

    def step_io(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The frame step's device tensors: ``active [slots]`` (its input mask), ``codes [slots, G]`` and
        ``eos [slots]`` (its outputs)."""
        raise NotImplementedError

    def allocate_launch(
        self,
        model: PrefillModel,
        kv: KVPoolLike,
        num_slots: int,
        max_len: int,
        last_out: torch.Tensor | None = None,
    ) -> None:
        """The launch ring and the prefill runner over ``kv``, once the slots' device state exists
        (``last_out``: ``Prefill``'s, for an adapter with ``prefills_last_position``)."""
        self.num_slots, self.max_len = num_slots, max_len
        self.host = HostRing(num_slots, self.num_groups, self.device)
        self.prefill_runner = Prefill(
            model,
            kv,
            max_len=max_len,
            min_attn_bucket=self.min_attn_bucket,
            dtype=self.dtype,
            last_out=last_out,
        )
        if self.graphs is not None:  # graphs were enabled before the slots existed (the stage's order)
            self.prefill_runner.enable_cuda_graphs()

    # -- the tick ------------------------------------------------------------------------------------------
    @torch.inference_mode()
    def launch(self, active: Sequence[bool], attn_len: int) -> Pending:
        n = len(active)
        b = bucket(n, self.num_slots)
        length = bucket(attn_len, self.max_len, self.min_attn_bucket)
        mask, codes, eos = self.step_io()
        # Host buffers come from a pinned ring: with async scheduling two steps can be outstanding, and a
        # pinned buffer must not be rewritten before the device has used it.
        self.host.upload_active(active, mask[:b])
        key = self.decode_key(b, length, self.variant(active))
        assert key is not None  # ``variant`` never picks an unlaunched key
        if self.graphs is not None:
            self.graphs.run(*key)
        else:
            self.decode_core(*key)
        return self.host.download(codes, eos, n)

    def collect(self, handle: object) -> tuple[np.ndarray, np.ndarray]:
        return collect(handle)

    def decode(self, active: Sequence[bool], attn_len: int) -> tuple[np.ndarray, np.ndarray]:
        """Launch and collect one step (the synchronous form, for tests and benchmarks)."""
        return self.collect(self.launch(active, attn_len))

    # -- CUDA graphs ---------------------------------------------------------------------------------------
    def enable_cuda_graphs(self) -> bool:
        """Graph ``decode_core`` per (batch, context) and the prefill per (rows, length, context) bucket
        (``enforce_eager: false``): all at once with ``capture_all_graphs``, else each on first use."""
        # Warm-up runs execute for real: with every row inactive they leave all slot state as it was (the
        # junk K/V they write sits at each row's next position, which its next real step overwrites).
        self.graphs = GraphCache(
            self.decode_core, enabled=True, quiesce=lambda key: all_inactive(self.step_io()[0])
        )
        # The prefill keeps its own pool: a prefill and a decode graph are never replayed concurrently
        # either, but separate pools keep one's capture from reusing memory the other's outputs occupy.
        if hasattr(self, "prefill_runner"):  # else allocate_launch() enables it once the slots exist
            self.prefill_runner.enable_cuda_graphs()
        return True

    def graph_keys(self) -> tuple[list[tuple[int, ...]], list[tuple[int, int, int]]]:
        """Every (batch, context, *variant) decode key and (rows, length, context) prefill key the engine
        can reach."""
        buckets = decode_graph_keys(self.num_slots, self.max_len, self.min_attn_bucket)
        keys = (self.decode_key(b, c, v) for b, c in buckets for v in self.variants())
        decode = list(dict.fromkeys(k for k in keys if k is not None))
        return decode, self.prefill_runner.graph_keys()

    def capture_all_graphs(self, variants: list[tuple[int, ...]] | None = None) -> int:
        """Capture every graph before serving (call with no request in flight): a lazily captured bucket
        stalls every running stream for the capture, which showed as first-audio outliers and cold
        underruns. ``variants`` limits the decode graphs to those variants (the deploy default's: each
        variant multiplies capture time and graph memory); another variant is captured on first use.
        Returns how many graphs were captured."""
        prefill_graphs = self.prefill_runner.graphs
        if self.graphs is None or prefill_graphs is None:
            return 0
        decode, prefill = self.graph_keys()
        if variants is not None:
            width = len(decode[0]) - len(variants[0]) if decode else 0
            decode = [key for key in decode if tuple(key[width:]) in variants]
        n = sum(self.graphs.capture(*key) for key in decode)
        # Prefill warm-up runs write junk K/V into the first positions of the slots in its static input;
        # no request holds a slot yet, and a slot's prefill rewrites every position it later reads.
        return n + sum(prefill_graphs.capture(*key) for key in prefill)
